"""(from placement.py) Where each request's KV cache goes under a fixed budget of token slots (chapter 4).

Four placement policies share one budget:

- ``max``: reserve, contiguously, the model's maximum length (2,048) for every request;
- ``pow2``: reserve the next power of two of the request's true total length;
- ``oracle``: reserve exactly the true total length (nobody knows it in practice);
- ``paged``: blocks of 16 slots from a :class:`~kvlib.paged.BlockManager`, one more block
  only when the last is full.

These are the vLLM paper's Orca-Max, Orca-Pow2, Orca-Oracle and vLLM. The paper built its
own Orca and assumed that it places each reservation with the buddy allocation algorithm
(Kwon et al. 2023, Section 6.1); :class:`BuddyAllocator` does that, so every reservation
occupies a block of a power-of-two size. :class:`ContiguousAllocator` (first fit, no
rounding) is kept to show what the allocator itself costs. Every memory answers the
scheduler of :mod:`kvlib.serving` in the same words: ``admit`` a request, ``append`` a slot
for its newest token (``paged`` may say no), ``release`` it, and ``breakdown``: where every
slot of the budget is.

(from serving.py) Which requests run at each step: first come, first served, continuous batching, and
preemption by recomputation (chapter 4).

The :class:`Scheduler` works with any memory of :mod:`kvlib.placement`. At every step
finished requests have left and waiting ones join (continuous, or iteration-level,
batching); a waiting request never overtakes an earlier one, and no request is dropped.
:func:`kvlib.simulator.simulate` drives it with a step-time model instead of a model;
:func:`kvlib.engine.run_engine` drives it with ``kvlib.model``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib.serving.traces import Request

CATEGORIES = ("tokens", "reserved", "internal", "external", "free")  # where every slot of the budget is


@dataclass(eq=False)
class SeqState:
    """A request inside the server: its tokens so far and what happened to it."""

    request: Request
    tokens: list[int]  # prompt, then generated tokens; all but the newest have a slot
    num_generated: int = 0
    num_preemptions: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def seq_id(self) -> int:
        return self.request.req_id

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.request.prompt_len :]


@dataclass
class StepPlan:
    """What one forward pass computes: prompts to prefill (with their cached prefix) and sequences to decode."""

    prefills: list[tuple[SeqState, int]]  # (sequence, tokens already in the prefix cache)
    decodes: list[SeqState]
    num_prefill_tokens: int = 0  # prompt tokens the prefills compute (the cached ones excluded)
    num_context_tokens: int = (
        0  # keys and values the decoding sequences read (their lengths, the new token included)
    )

    def __post_init__(self):
        self.num_prefill_tokens = sum(len(s.tokens) - cached for s, cached in self.prefills)
        self.num_context_tokens = sum(len(s.tokens) for s in self.decodes)

    @property
    def seqs(self) -> list[SeqState]:
        """Prefilled sequences first, then decoded ones: the order of the step's new tokens."""
        return [s for s, _ in self.prefills] + self.decodes

    @property
    def num_seqs(self) -> int:
        return len(self.prefills) + len(self.decodes)


# One record per step: when it started, what it computed, how many requests waited, the slots
# the running requests hold (a shared token once per request), the prompts it prefilled, and
# the budget by category.
STEP_FIELDS = (
    "start_s",
    "num_seqs",
    "prefill_tokens",
    "context_tokens",
    "num_waiting",
    "held_tokens",
    "num_prefills",
    *CATEGORIES,
)
