"""A KV cache keeping at most ``budget`` tokens per sequence and layer, chosen by a policy (quality chapter).

:class:`EvictingKVCache` implements the model's two-method protocol
(:class:`~kvlib.model.config.KVCache`) like :class:`~kvlib.cache.contiguous.ContiguousKVCache`,
but after every step each layer drops the tokens that its policy
(:mod:`kvlib.cache.eviction_policies`: sliding window, StreamingLLM, H2O) does not keep. Chapter 7
("What a smaller cache costs") runs the trained model through it to
measure what each policy costs at equal KV budget, against the full cache.

How a step goes, for each layer:

1. the new tokens' K and V join those held (keys arrive rotated at their positions, so the
   tokens kept keep their original rotary positions and nothing is re-rotated);
2. the queries attend over everything held, by an explicit softmax over the grouped heads
   (each query sees the held keys at positions up to its own), because H2O needs the weights:
   each held token's score grows by the weight it received, summed over the query heads and
   the step's queries;
3. the policy picks at most ``budget`` tokens per sequence; K, V, positions and scores of the
   others are dropped.

So between steps a layer holds at most ``budget`` tokens, and during one step at most
``budget + num_new``: the new tokens must be attended to before they can be judged. The
queries of a prefill of many tokens see the whole prefill; feed a long text in steps of one
token (after a short prompt) so that every query sees exactly what the policy kept, as in
decoding. H2O's kept set differs between sequences, so the batch is supported with one set per
sequence (all sequences hold the same number of tokens). Eviction copies the kept tokens into new
tensors at every step: this cache measures quality, not speed.
"""

from __future__ import annotations

import math

import torch

from kvlib import KVLibError
from kvlib.cache.eviction_policies import H2O, SlidingWindow, StreamingLLM
from kvlib.checks import check_new_tokens, require_int
from kvlib.kernels.shape_checks import check_step
from kvlib.model.config import ModelConfig


def attention_with_weights(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys at arbitrary positions, with the weight each key received.

    q: (batch, num_heads, num_new, head_dim) at ``q_positions`` (batch, num_new);
    k, v: (batch, num_kv_heads, held, head_dim) at ``k_positions`` (batch, held), each K/V
    head shared by ``num_heads // num_kv_heads`` query heads (the grouping of
    :func:`~kvlib.model.attention.grouped_attention`). A query sees the keys at positions up
    to its own. Returns the output (batch, num_heads, num_new, head_dim) and the weights
    summed over query heads and queries, (batch, held), in float32.
    """
    batch, num_heads, num_new, head_dim = q.shape
    num_kv_heads, held = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    rows = q.reshape(batch, num_kv_heads, group * num_new, head_dim)  # each group's queries as rows
    scores = (rows @ k.transpose(-1, -2)) / math.sqrt(head_dim)  # (batch, kv_heads, group * num_new, held)
    scores = scores.view(batch, num_kv_heads, group, num_new, held)
    visible = (
        k_positions[:, None, None, None, :] <= q_positions[:, None, None, :, None]
    )  # (b, 1, 1, new, held)
    weights = torch.softmax(scores.float().masked_fill(~visible, float("-inf")), dim=-1)
    received = weights.sum(dim=(1, 2, 3))  # (batch, held): over kv heads, their group's heads, queries
    out = weights.to(v.dtype).view(batch, num_kv_heads, group * num_new, held) @ v
    return out.view(batch, num_heads, num_new, head_dim), received


class _LayerHeld:
    """What one layer holds: K, V, their positions and accumulated scores, all for the same tokens."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        self.k = k  # (batch, kv_heads, held, head_dim), rotated at their positions
        self.v = v  # (batch, kv_heads, held, head_dim)
        self.positions = positions  # (batch, held): each token's position in its sequence, ascending
        self.scores = torch.zeros(positions.shape, device=positions.device)  # (batch, held), float32
        self.seen = 0  # tokens per sequence this layer has been handed so far

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Add the step's new tokens after those held (their scores start at 0)."""
        self.k = torch.cat([self.k, k], dim=2)
        self.v = torch.cat([self.v, v], dim=2)
        self.positions = torch.cat([self.positions, positions], dim=1)
        self.scores = torch.cat([self.scores, torch.zeros(positions.shape, device=positions.device)], dim=1)

    def keep(self, slots: torch.Tensor) -> None:
        """Keep only ``slots`` (batch, kept), ascending, of every sequence."""
        if slots.shape[1] == self.positions.shape[1]:
            return  # nothing to evict (every policy keeps all when they fit)
        index = slots[:, None, :, None].expand(-1, self.k.shape[1], -1, self.k.shape[3])
        self.k, self.v = self.k.gather(2, index), self.v.gather(2, index)
        self.positions = self.positions.gather(1, slots)
        self.scores = self.scores.gather(1, slots)


class EvictingKVCache:
    """At most ``policy.budget`` tokens per sequence and layer, chosen after every step by ``policy``.

    ``batch_size`` sequences, all of the same length; ``max_len`` caps the positions handed out
    (the model's ``max_seq_len`` by default), not the tokens held.
    """

    def __init__(
        self,
        config: ModelConfig,
        batch_size: int,
        policy: SlidingWindow | StreamingLLM | H2O,
        max_len: int | None = None,
        device=None,
        dtype=torch.float32,
    ):
        max_len = config.max_seq_len if max_len is None else max_len
        batch_size, max_len = require_int(batch_size, "batch_size"), require_int(max_len, "max_len")
        if not isinstance(policy, SlidingWindow | StreamingLLM | H2O):
            raise KVLibError(f"policy must be a SlidingWindow, StreamingLLM or H2O, not {policy!r}")
        self.config = config  # the model's shape: num_kv_heads and head_dim of the K/V handed in
        self.policy = policy  # which tokens each layer keeps after a step
        self.batch_size = batch_size  # sequences per step
        self.max_len = max_len  # positions per sequence the cache hands out
        empty = (batch_size, config.num_kv_heads, 0, config.head_dim)
        no_positions = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        self.layers = [
            _LayerHeld(
                torch.zeros(empty, device=device, dtype=dtype),
                torch.zeros(empty, device=device, dtype=dtype),
                no_positions,
            )
            for _ in range(config.num_layers)
        ]  # one per layer: what it holds
        self.length = 0  # tokens per sequence seen (after the current step's prepare), held or evicted
        self._start = 0  # position of the current step's first new token
        self._new_positions = no_positions  # (batch, num_new): the current step's positions

    @property
    def num_bytes(self) -> int:
        """Bytes of the K and V held now by all layers (positions and scores not counted)."""
        return sum(2 * held.k.numel() * held.k.element_size() for held in self.layers)

    def num_held(self, layer: int) -> int:
        """Tokens per sequence that ``layer`` holds now (at most the budget between steps)."""
        return self.layers[layer].positions.shape[1]

    def held_positions(self, layer: int) -> torch.Tensor:
        """Positions (batch, held) of the tokens ``layer`` holds, ascending in each sequence."""
        return self.layers[layer].positions

    def prepare(self, num_new: int) -> torch.Tensor:
        """Count ``num_new`` more tokens per sequence; return their positions, (batch, num_new)."""
        check_new_tokens(num_new, self.length, self.max_len)
        self._start, self.length = self.length, self.length + num_new
        device = self._new_positions.device
        self._new_positions = torch.arange(self._start, self.length, device=device).expand(
            self.batch_size, -1
        )
        return self._new_positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Add k, v (batch, kv_heads, num_new, head_dim); attend q over what is held; then evict.

        q: (batch, heads, num_new, head_dim); returns (batch, heads, num_new, head_dim).
        """
        num_new = self.length - self._start
        expected = (self.batch_size, self.config.num_kv_heads, num_new, self.config.head_dim)
        check_step(layer, len(self.layers), q, k, v, expected)
        held = self.layers[layer]
        if held.seen != self._start:
            raise KVLibError(f"layer {layer} has seen {held.seen} tokens; this step starts at {self._start}")
        held.append(k, v, self._new_positions)
        held.seen = self.length
        out, received = attention_with_weights(q, held.k, held.v, self._new_positions, held.positions)
        held.scores += received
        held.keep(self.policy.keep_indices(held.scores))
        return out
