"""What the scheduler and the memory policies share (chapter 4).

The :class:`~kvlib.serving.scheduler.Scheduler` decides which requests run at each step;
a memory policy of :mod:`kvlib.serving.placement` decides where their KV cache goes. The
two meet in this module, below both of them:

- :class:`SeqState`: a request inside the server; its ``tokens`` list is the one place
  a sequence's tokens are stored (the block manager only reads it);
- :class:`StepPlan`: what one forward pass computes, the scheduler's answer at each step;
- :class:`StepRecord`: what the scheduler records about a step, from which
  :class:`~kvlib.serving.results.RunResult` builds its arrays;
- :data:`CATEGORIES`: where every slot of the KV budget is at a step;
- :class:`Memory`: the contract (``admit``, ``append``, ``release``, ``mark_computed``,
  ``breakdown``) that every memory policy keeps and the scheduler relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvlib import KVLibError
from kvlib.serving.traces import Request

# Where every slot of the budget is, in the order of Memory.breakdown and of StepRecord's last fields:
# storing a token; reserved for a token still to come; taken but never to be filled (internal
# fragmentation); free but of no use to the first waiting request (external fragmentation); free.
CATEGORIES = ("tokens", "reserved", "internal", "external", "free")


@dataclass(eq=False)
class SeqState:
    """A request inside the server: its tokens so far and what happened to it.

    Mutable, and compared by identity: the scheduler appends each new token to ``tokens``
    and a memory policy reads it (a block manager hashes its blocks from it).
    """

    request: Request
    tokens: list[int]  # prompt, then generated tokens; all but the newest have a slot
    num_generated: int = 0  # tokens generated so far (kept across a preemption)
    num_preemptions: int = 0  # times this request was preempted and recomputed
    num_swaps: int = 0  # times it was preempted by swapping its K/V out to host memory (chapter 8)
    first_token_s: float | None = None  # when its first output token was produced
    finish_s: float | None = None  # when its last output token was produced

    @property
    def seq_id(self) -> int:
        """The request's id, the key a memory policy files the sequence under."""
        return self.request.req_id

    @property
    def generated(self) -> list[int]:
        """The tokens generated so far (``tokens`` after the prompt)."""
        return self.tokens[self.request.prompt_len :]


@dataclass(frozen=True, slots=True)  # slots: made at every step, cheaper to build
class StepPlan:
    """What one forward pass computes: prompts to prefill (with their cached prefix) and sequences to decode.

    The totals are computed when the plan is made, from the sequences' lengths at that
    moment (the step's new tokens are appended to ``tokens`` later, by the scheduler).
    With chunked prefill (chapter 8) a prefill may compute only a chunk of its sequence,
    ``tokens[start:end]``: ``prefill_ends`` holds each chunk's end, and a chunk that stops
    short of the sequence's end (a *partial* prefill) produces no token.
    """

    prefills: tuple[tuple[SeqState, int], ...]  # (sequence, its first token computed: cached prefix or chunk)
    decodes: tuple[SeqState, ...]  # sequences that compute one token each, oldest first
    # where each prefill's chunk ends (one per prefill); None: every prefill runs to its sequence's end
    prefill_ends: tuple[int, ...] | None = field(default=None, kw_only=True)
    swaps: tuple[int, ...] = field(default=(), kw_only=True)  # K/V tokens of each copy to or from the host
    num_prefill_tokens: int = field(init=False)  # prompt tokens the prefills compute (cached ones excluded)
    num_context_tokens: int = field(init=False)  # K/V the decodes read (their lengths, newest token included)
    ends: tuple[int, ...] = field(init=False)  # where each prefill stops, as the plan was made
    done: tuple[SeqState, ...] = field(init=False)  # prefills that reach their sequence's end: get a token

    def __post_init__(self):
        # frozen: the totals are set once, through object.__setattr__
        if self.prefill_ends is None:
            ends = tuple(len(s.tokens) for s, _ in self.prefills)
            done = tuple(s for s, _ in self.prefills)
        else:
            ends = tuple(self.prefill_ends)
            if len(ends) != len(self.prefills):
                raise KVLibError(f"prefill_ends has {len(ends)} ends for {len(self.prefills)} prefills")
            done = tuple(s for (s, _), end in zip(self.prefills, ends, strict=True) if end == len(s.tokens))
        object.__setattr__(self, "ends", ends)
        object.__setattr__(self, "done", done)
        computed = sum(end - n for (_, n), end in zip(self.prefills, ends, strict=True))
        object.__setattr__(self, "num_prefill_tokens", computed)
        object.__setattr__(self, "num_context_tokens", sum(len(s.tokens) for s in self.decodes))

    @property
    def chunks(self) -> list[tuple[SeqState, int, int]]:
        """Each prefill as (sequence, start, end): the model runs over ``tokens[start:end]``."""
        return [(s, n, end) for (s, n), end in zip(self.prefills, self.ends, strict=True)]

    @property
    def seqs(self) -> list[SeqState]:
        """Sequences that get a new token, prefilled ones first, then decoded ones: the order of the
        step's new tokens (a partial prefill gets none)."""
        return list(self.done) + list(self.decodes)

    @property
    def num_seqs(self) -> int:
        """Sequences computed at this step (a partial prefill included): without chunked prefill,
        those that get a new token."""
        return len(self.prefills) + len(self.decodes)


@dataclass(frozen=True, slots=True)  # slots: made at every step, cheaper to build
class StepRecord:
    """What the scheduler records about one step, when it plans it.

    The field names are the keys of :attr:`kvlib.serving.results.RunResult.steps`; the last
    five are :data:`CATEGORIES`, in slots, summing to the budget. ``new_tokens`` equals
    ``num_seqs`` unless a prompt is prefilled in chunks or tokens are speculated (chapter 8).
    """

    start_s: float  # when the step was planned, on the driver's clock (seconds)
    num_seqs: int  # sequences computed: prefills + decodes
    prefill_tokens: int  # prompt tokens prefilled, cached ones excluded (recomputation included)
    context_tokens: int  # K/V tokens the decodes read, each newest token included
    num_waiting: int  # requests arrived but not admitted, after this step's admissions
    held_tokens: int  # slots holding tokens of running requests (a shared token once per request)
    num_prefills: int  # prompts prefilled (each one forward pass of the real engine), chunks included
    new_tokens: int  # tokens generated: one per decode and finished prefill (speculative decoding: more)
    swapped_tokens: int  # K/V tokens copied between device and host memory (swapping, chapter 8)
    tokens: int  # slots storing tokens (a block shared by prefix caching counted once)
    reserved: int  # slots reserved for tokens the running requests will still produce
    internal: int  # slots taken that no token will fill (policy or allocator rounding, last blocks)
    external: int  # free slots in gaps too small for the first waiting request, which fits their total
    free: int  # the other free slots


@runtime_checkable
class Memory(Protocol):
    """The contract between the scheduler and a memory policy (:mod:`kvlib.serving.placement`).

    A memory holds a budget of ``num_slots`` token slots. The scheduler tells it when a
    request starts (``admit``), grows (``append``) and leaves (``release``); the driver tells
    it when a step's K/V exist (``mark_computed``); the scheduler asks it, once per step,
    where every slot is (``breakdown``). A refusal (``None``, ``False``) never changes the
    memory: the scheduler answers it by waiting or by preempting.
    """

    num_slots: int  # slots of the budget: what breakdown's categories add up to

    def admit(self, seq: SeqState) -> int | None:
        """Take memory for a new (or recomputed) sequence, for all of ``seq.tokens``.

        Returns how many of its leading tokens are already in the prefix cache (0 without
        prefix caching): the prefill computes only the rest. ``None`` when it does not fit
        now (too few free blocks, the watermark, no gap for a reservation); nothing is
        taken, and the scheduler stops admitting for this step, so that no later request
        overtakes this one.
        """
        ...

    def append(self, seq: SeqState) -> bool:
        """Give the newest token, ``seq.tokens[-1]``, of a running sequence its slot.

        ``True`` when it has one (a reservation always does). ``False`` when a new block is
        needed and none is free; nothing changes, and the scheduler preempts its youngest
        running request (perhaps ``seq`` itself), then asks again.
        """
        ...

    def release(self, seq: SeqState) -> None:
        """Free everything ``seq`` holds: it finished, or it is preempted (then ``admit`` again later)."""
        ...

    def mark_computed(self, plan: StepPlan) -> None:
        """The K/V of every sequence of ``plan`` now exist (with prefix caching, others may share them).

        Called by the driver after the step's forward pass, not by the scheduler; the real
        engine's paged cache marks its blocks itself.
        """
        ...

    def breakdown(self, held: int, head: SeqState | None) -> tuple[int, ...]:
        """Slots in each of :data:`CATEGORIES`, in that order, summing to ``num_slots``.

        ``held``: slots holding tokens of running requests, as the scheduler counts them (a
        shared token once per request); ``head``: the first waiting request, or ``None``,
        which decides whether free slots count as external fragmentation. The scheduler
        calls it once per step, after admission, and records it in a :class:`StepRecord`.
        """
        ...
