"""Which cached tokens a layer keeps under a budget: sliding window, StreamingLLM, H2O (quality chapter).

Evicting tokens is the third lossy way to shrink a KV cache, beside quantizing it
(:mod:`kvlib.cache.quantized`) and sharing heads (GQA/MQA). Chapter 7 ("What a smaller
cache costs") runs the trained model through
:class:`~kvlib.cache.evicting_cache.EvictingKVCache` with each policy below, at several budgets, and
measures perplexity over long sequences and the recall of a retrieval probe.

A policy sees the tokens one layer of one sequence holds, in position order, and names those to
keep. Each policy is a frozen dataclass with two views of the same rule:

- :meth:`keep_indices` on tensors, (batch, held) accumulated scores -> (batch, kept) slot indices,
  ascending: what the cache calls after every step;
- :meth:`kept_positions` on one sequence's positions (and scores), returning the kept positions
  as a sorted list: what the tests and the chapter's small worked examples call.

With ``budget`` >= the tokens held, every policy keeps them all.

- :class:`SlidingWindow`: the last ``budget`` tokens.
- :class:`StreamingLLM`: the first ``num_sinks`` tokens (the "attention sinks") and the last
  ``budget - num_sinks`` (Xiao et al. 2023, "Efficient Streaming Language Models with Attention
  Sinks", arXiv:2309.17453). The paper renumbers positions inside the cache (its keys are
  stored before rotation and re-rotated each step); the cache here keeps every token at its
  original rotary position, which is the same while the text fits the trained context.
- :class:`H2O`: the last ``recent`` tokens, plus the ``budget - recent`` older ones with the
  largest attention weight accumulated so far, summed over the layer's query heads and over
  every query that saw them (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle for Efficient
  Generative Inference of Large Language Models", arXiv:2306.14048). The paper keeps a set per
  head; one set per layer keeps the K/V heads of a token together, which grouped heads need.
  Ties in score keep the earlier position (a stable descending sort), so the kept set is
  deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import is_int

DEFAULT_NUM_SINKS = 4  # StreamingLLM's four initial tokens, enough in the paper for every model it tried


def _check_count(name: str, value, minimum: int) -> None:
    """One-line KVLibError unless ``value`` is an int (not a bool) >= ``minimum``."""
    if not is_int(value) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise KVLibError(f"{name} must be {kind}, not {value!r}")


def _check_scores(scores: torch.Tensor) -> tuple[int, int]:
    """(batch, held) of a scores tensor, or a one-line KVLibError if it is not 2-D."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise KVLibError(f"scores must be a (batch, held) tensor, not {shape}")
    return scores.shape[0], scores.shape[1]


def _window(held: int, num_first: int, num_last: int, batch: int, device) -> torch.Tensor:
    """Slots 0 .. num_first-1 and the last num_last of ``held``, (batch, kept); all if they cover it."""
    if num_first + num_last >= held:
        slots = torch.arange(held, device=device)
    else:
        first = torch.arange(num_first, device=device)
        slots = torch.cat([first, torch.arange(held - num_last, held, device=device)])
    return slots.expand(batch, -1)


class _Policy:
    """What the three policies share: the one-sequence view on top of :meth:`keep_indices`."""

    budget: int

    def keep_indices(self, scores: torch.Tensor) -> torch.Tensor:  # pragma: no cover - each policy has one
        raise NotImplementedError

    def kept_positions(self, positions: Sequence[int], scores: Sequence[float] | None = None) -> list[int]:
        """The positions kept of one sequence's held ``positions`` (ascending), given their scores.

        ``scores`` (one per position, the accumulated attention weight) only matters to :class:`H2O`;
        the others ignore it. Returns a sorted list.
        """
        positions = list(positions)
        if sorted(positions) != positions or len(set(positions)) != len(positions):
            raise KVLibError(f"positions must be distinct and ascending, not {positions}")
        if scores is None:
            scores = [0.0] * len(positions)
        if len(scores) != len(positions):
            raise KVLibError(f"{len(scores)} scores for {len(positions)} positions")
        slots = self.keep_indices(torch.tensor([list(scores)], dtype=torch.float64))[0]
        return [positions[i] for i in slots.tolist()]


@dataclass(frozen=True)
class SlidingWindow(_Policy):
    """Keep the last ``budget`` tokens: the baseline both papers beat when early tokens matter."""

    budget: int  # tokens kept per sequence and layer

    def __post_init__(self):
        _check_count("budget", self.budget, 1)

    def keep_indices(self, scores: torch.Tensor) -> torch.Tensor:
        """Slots to keep, (batch, min(held, budget)) ascending; ``scores`` (batch, held) only gives shape."""
        batch, held = _check_scores(scores)
        return _window(held, 0, self.budget, batch, scores.device)


@dataclass(frozen=True)
class StreamingLLM(_Policy):
    """Keep the first ``num_sinks`` tokens and the last ``budget - num_sinks`` (Xiao et al. 2023)."""

    budget: int  # tokens kept per sequence and layer, sinks included
    num_sinks: int = DEFAULT_NUM_SINKS  # initial tokens kept forever (the attention sinks)

    def __post_init__(self):
        _check_count("budget", self.budget, 1)
        _check_count("num_sinks", self.num_sinks, 0)
        if self.num_sinks > self.budget:
            raise KVLibError(f"num_sinks ({self.num_sinks}) exceeds the budget ({self.budget})")

    def keep_indices(self, scores: torch.Tensor) -> torch.Tensor:
        """Slots to keep, (batch, min(held, budget)) ascending; ``scores`` (batch, held) gives only the shape.

        The sinks are the first slots held, which are the first positions of the sequence:
        this policy never evicts them.
        """
        batch, held = _check_scores(scores)
        return _window(held, self.num_sinks, self.budget - self.num_sinks, batch, scores.device)


@dataclass(frozen=True)
class H2O(_Policy):
    """Keep the last ``recent`` tokens and the ``budget - recent`` heaviest older ones (Zhang et al. 2023)."""

    budget: int  # tokens kept per sequence and layer, heavy hitters and recent ones together
    recent: int  # most recent tokens kept whatever their score (the paper splits the budget in half)

    def __post_init__(self):
        _check_count("budget", self.budget, 1)
        _check_count("recent", self.recent, 0)
        if self.recent > self.budget:
            raise KVLibError(f"recent ({self.recent}) exceeds the budget ({self.budget})")

    def keep_indices(self, scores: torch.Tensor) -> torch.Tensor:
        """Slots to keep, (batch, min(held, budget)) ascending, from the accumulated ``scores`` (batch, held).

        Among the slots older than the recent window, the ``budget - recent`` largest scores win;
        equal scores keep the earlier slot (stable descending sort). Each sequence keeps its own set.
        """
        batch, held = _check_scores(scores)
        if held <= self.budget:
            return torch.arange(held, device=scores.device).expand(batch, -1)
        num_old = held - self.recent  # slots that compete on score
        order = torch.sort(scores[:, :num_old], dim=1, descending=True, stable=True).indices  # (batch, old)
        heavy = order[:, : self.budget - self.recent].sort(dim=1).values  # (batch, heavy), ascending
        recent = torch.arange(num_old, held, device=scores.device).expand(batch, -1)  # (batch, recent)
        return torch.cat([heavy, recent], dim=1)  # (batch, budget), ascending: heavy slots precede recent


EVICTION_POLICIES = ("window", "sinks", "h2o")  # names eviction_policy accepts


def eviction_policy(
    name: str, budget: int, num_sinks: int = DEFAULT_NUM_SINKS, recent: int | None = None
) -> SlidingWindow | StreamingLLM | H2O:
    """The policy called ``name`` ("window", "sinks" or "h2o") at ``budget`` tokens.

    ``num_sinks`` is StreamingLLM's (4 by default, as in the paper); ``recent`` is H2O's
    (half the budget by default, the paper's equal split of heavy hitters and recent tokens).
    The chapter sweeps budgets by name with this.
    """
    if name == "window":
        return SlidingWindow(budget)
    if name == "sinks":
        return StreamingLLM(budget, num_sinks)
    if name == "h2o":
        _check_count("budget", budget, 1)
        return H2O(budget, budget // 2 if recent is None else recent)
    raise KVLibError(f"unknown eviction policy {name!r}: choose one of {', '.join(EVICTION_POLICIES)}")
