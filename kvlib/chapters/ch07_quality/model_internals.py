"""What the trained model does inside, for chapter 7's "what a model this small may not show".

Two effects motivate the papers' designs, and a small model need not have them:

- **outlier channels** in the keys (KIVI quantizes keys per channel because a few channels carry
  much larger values than the rest): :func:`channel_outlier_ratios` gives, per layer, the largest
  channel's mean absolute value over the median channel's, for keys and for values;
- **attention sinks** (StreamingLLM keeps the first tokens because late queries put a large share
  of their weight on them): :func:`first_token_attention` gives, per layer, the mean weight that
  queries past a position put on position 0, beside the uniform share.

Both read the model through :class:`RecordingCache`, a whole-document
:class:`~kvlib.model.config.KVCache` that attends by an explicit softmax and keeps what it saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.model.attention import causal_mask
from kvlib.model.llama import TinyLlama


class RecordingCache:
    """One pass over whole documents that keeps each layer's K, V and attention weights on position 0."""

    def __init__(self, batch_size: int, seq_len: int):
        self.positions = torch.arange(seq_len).expand(batch_size, seq_len)  # (batch, seq_len)
        self.keys: list[torch.Tensor] = []  # per layer: (batch, kv_heads, seq, head_dim), rotated
        self.values: list[torch.Tensor] = []  # per layer: (batch, kv_heads, seq, head_dim)
        self.first_weight: list[torch.Tensor] = []  # per layer: (batch, heads, seq) weight on position 0

    def prepare(self, num_new: int) -> torch.Tensor:
        """Positions 0 .. num_new - 1: the documents are read in one pass."""
        if self.keys:
            raise KVLibError("a RecordingCache reads one pass only")
        return self.positions[:, :num_new]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of q (batch, heads, seq, head_dim) over k, v; records K, V and the weights."""
        group = q.shape[1] // k.shape[1]
        k_all, v_all = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (batch, heads, seq, hd)
        scores = q @ k_all.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (batch, heads, seq, seq)
        mask = causal_mask(0, q.shape[2], k.shape[2], q.device)  # (seq, seq)
        weights = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1)
        self.keys.append(k)
        self.values.append(v)
        self.first_weight.append(weights[..., 0])  # (batch, heads, seq)
        return weights.to(v.dtype) @ v_all  # (batch, heads, seq, head_dim)


@dataclass(frozen=True)
class LayerInside:
    """One layer's outlier ratios and first-token attention."""

    layer: int  # 0-based
    key_outlier_ratio: float  # max over channels of mean |k| / median over channels
    value_outlier_ratio: float  # the same for v
    first_token_weight: float  # mean weight on position 0 of queries at positions >= from_position
    uniform_weight: float  # the mean of 1 / (t + 1) over the same queries: no preference


def record(model: TinyLlama, tokens: torch.Tensor) -> RecordingCache:
    """Read ``tokens`` (batch, seq) in one pass through a :class:`RecordingCache`."""
    cache = RecordingCache(*tokens.shape)
    with torch.inference_mode():
        model(tokens, cache)
    return cache


def _outlier_ratio(x: torch.Tensor) -> float:
    """x (batch, kv_heads, seq, head_dim): max over (head, channel) of mean |x|, over their median."""
    per_channel = x.abs().mean(dim=(0, 2)).flatten()  # (kv_heads * head_dim,)
    return float(per_channel.max() / per_channel.median())


def inside(model: TinyLlama, tokens: torch.Tensor, from_position: int = 128) -> list[LayerInside]:
    """Outlier ratios and first-token attention of every layer on ``tokens`` (batch, seq)."""
    seq = tokens.shape[1]
    if not 1 <= from_position < seq:
        raise KVLibError(f"from_position must be in [1, {seq}), not {from_position!r}")
    cache = record(model, tokens)
    uniform = float((1.0 / torch.arange(from_position + 1, seq + 1, dtype=torch.float64)).mean())
    return [
        LayerInside(
            layer,
            _outlier_ratio(cache.keys[layer]),
            _outlier_ratio(cache.values[layer]),
            float(cache.first_weight[layer][..., from_position:].mean()),
            uniform,
        )
        for layer in range(len(cache.keys))
    ]
