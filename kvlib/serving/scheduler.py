"""Which requests run at each step: first come, first served, continuous batching, and
preemption by recomputation (chapter 4); chunked prefill and swapping (chapter 8).

The :class:`Scheduler` works with any memory that keeps the :class:`~kvlib.serving.types.Memory`
contract (the policies of :mod:`kvlib.serving.placement`). At every step finished requests
have left and waiting ones join (continuous, or iteration-level, batching); a waiting
request never overtakes an earlier one, and no request is dropped.
:func:`kvlib.serving.simulator.simulate` drives it with a step-time model instead of a
model; :func:`kvlib.serving.engine.run_engine` drives it with :mod:`kvlib.model`.

Chapter 8 adds what engines do now, each off by default (chapter 4's runs are unchanged):
chunked prefill (Agrawal et al. 2024, Sarathi-Serve; vLLM's ``--enable-chunked-prefill``
with ``--max-num-batched-tokens``): a budget of tokens computed per step, decodes first, the
rest to chunks of prompts; swapping (Kwon et al. 2023, Section 4.5; vLLM's
``--swap-space``): a preempted request's K/V go to a :class:`~kvlib.serving.swap.HostPool`
and come back, instead of being recomputed; and several tokens per step and sequence from
speculative decoding (:meth:`Scheduler.complete`).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.serving.swap import HostPool
from kvlib.serving.traces import Request
from kvlib.serving.types import Memory, SeqState, StepPlan, StepRecord


def _priority(seq: SeqState) -> tuple[float, int]:
    """First come, first served: earlier arrivals run first and are preempted last."""
    return seq.request.arrival_s, seq.request.req_id


PREEMPTION_MODES = ("recompute", "swap")  # vLLM's --preemption-mode

# A preemption policy (chapter 4's exercise 4.6): given the running requests that could give their
# memory up, oldest first, it returns the one to preempt.
VictimPolicy = Callable[[tuple[SeqState, ...]], SeqState]


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one step, as in vLLM (at least one prompt always fits), and chapter 8's options."""

    max_num_seqs: int = 256  # sequences running at once (decoding or being prefilled)
    max_prefill_tokens: int = 2048  # tokens of the prompts admitted at one step, their cached prefix included
    enable_chunked_prefill: bool = False  # split prompts into chunks within a token budget per step
    # with chunked prefill: tokens computed per step, one per decode first (None: max_prefill_tokens)
    max_num_batched_tokens: int | None = None
    preemption_mode: str = "recompute"  # "swap": K/V go to a host pool (recompute when it is full)
    num_host_blocks: int = 0  # blocks of that host pool (vLLM's --swap-space, in blocks); swap needs >= 1

    def __post_init__(self):
        # 0 sequences would run nothing, ever: name it here rather than as "a request never fits"
        require_int(self.max_num_seqs, "max_num_seqs")
        require_int(self.max_prefill_tokens, "max_prefill_tokens")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise KVLibError(
                f"enable_chunked_prefill must be True or False, not {self.enable_chunked_prefill!r}"
            )
        if self.max_num_batched_tokens is not None:
            require_int(self.max_num_batched_tokens, "max_num_batched_tokens")
            if not self.enable_chunked_prefill:
                raise KVLibError(
                    "max_num_batched_tokens needs enable_chunked_prefill=True "
                    "(without chunks, max_prefill_tokens bounds each step's prompts)"
                )
        if self.enable_chunked_prefill and self.token_budget < self.max_num_seqs:
            # as vLLM requires: every running sequence can then decode at every step
            raise KVLibError(
                f"max_num_batched_tokens ({self.token_budget}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise KVLibError(f"unknown preemption_mode {self.preemption_mode!r}; choose recompute or swap")
        require_int(self.num_host_blocks, "num_host_blocks", 0)
        if self.preemption_mode == "swap" and self.num_host_blocks < 1:
            raise KVLibError("preemption_mode 'swap' needs num_host_blocks >= 1 (the host pool)")

    @property
    def token_budget(self) -> int:
        """With chunked prefill, tokens computed per step: ``max_num_batched_tokens``, or
        ``max_prefill_tokens`` when that is None."""
        return self.max_prefill_tokens if self.max_num_batched_tokens is None else self.max_num_batched_tokens


class Scheduler:
    """First come, first served, continuous batching, preemption by recomputation (or swapping).

    Each :meth:`schedule` call plans one step; :meth:`complete` records the tokens the step
    produced and retires finished requests. The driver (the simulator or the real engine)
    keeps the clock and runs the plans. ``host``: the host pool of ``preemption_mode="swap"``
    (the drivers make it from ``config.num_host_blocks``). ``victim``: a preemption policy that
    replaces first come, first served's choice of whom to preempt (see :meth:`victim`); None
    keeps it.
    """

    def __init__(
        self,
        memory: Memory,
        requests: list[Request],
        config: SchedulerConfig = SchedulerConfig(),
        host: HostPool | None = None,
        victim: VictimPolicy | None = None,
    ):
        if config.preemption_mode == "swap" and not isinstance(host, HostPool):
            raise KVLibError("preemption_mode 'swap' needs a HostPool (host=...)")
        if victim is not None and not callable(victim):
            raise KVLibError(
                f"victim must be a function (running requests -> the one to preempt) or None, not "
                f"{type(victim).__name__}"
            )
        self.memory, self.config, self.host = memory, config, host
        self.victim_policy = victim  # None: FCFS, the youngest running request is preempted
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.req_id)))  # not arrived yet
        self.waiting: deque[SeqState] = deque()  # arrived, not running; preempted ones at the front
        self.running: list[SeqState] = []  # in priority order: oldest first
        self.swapped: list[SeqState] = []  # swapped out to the host pool, in priority order
        self.prefilling: dict[int, int] = {}  # chunked prefill: running seq_id -> its tokens computed so far
        self.finished: list[SeqState] = []  # in finishing order
        self.num_preemptions = 0  # preemptions by recomputation
        self.num_swaps = 0  # preemptions by swapping out
        self.preempted_generated: list[int] = []  # per recomputation: tokens the victim had generated
        self.held = 0  # slots holding tokens, over running requests
        self.records: list[StepRecord] = []  # one per schedule() call
        self._swaps: list[int] = []  # this step's copies to and from the host (tokens each)

    def has_work(self) -> bool:
        """Is any request not finished (not arrived yet, waiting, swapped out or running)?"""
        return bool(self.pending or self.waiting or self.running or self.swapped)

    def next_arrival(self) -> float:
        """When the next request that has not arrived yet arrives (``inf`` if none is left)."""
        return self.pending[0].arrival_s if self.pending else math.inf

    def _arrive(self, now: float) -> None:
        while self.pending and self.pending[0].arrival_s <= now:
            request = self.pending.popleft()
            self.waiting.append(SeqState(request, list(request.prompt)))

    def _preempt(self, seq: SeqState) -> None:
        """Free a running request's memory: swapped out if the mode and the host pool allow, else recomputed.

        A request still being prefilled in chunks is always recomputed (its K/V are incomplete).
        """
        self.running.remove(seq)
        mid_prefill = self.prefilling.pop(seq.seq_id, None) is not None
        num_slotted = len(seq.tokens) - (0 if mid_prefill else 1)  # the newest token has no slot yet
        swap = (
            self.config.preemption_mode == "swap"
            and not mid_prefill
            and self.host.swap_out(seq.seq_id, num_slotted)
        )
        self.memory.release(seq)
        self.held -= num_slotted
        if swap:
            seq.num_swaps += 1
            self.num_swaps += 1
            self._swaps.append(num_slotted)
            bisect.insort(self.swapped, seq, key=_priority)
            return
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.preempted_generated.append(seq.num_generated)
        self.waiting.appendleft(seq)

    def schedule(self, now: float) -> StepPlan:
        """Plan the step that starts at ``now``: which sequences decode, which are prefilled.

        1. Arrivals: every request with ``arrival_s <= now`` joins the back of the queue.
        2. Decodes: each running request, oldest first (arrival time, then id), asks the
           memory for a slot for its newest token (:meth:`Memory.append`). When the memory
           has none, the youngest running request is preempted by recomputation (the
           choice of :meth:`victim`, which a preemption policy may change): its memory is
           released, it keeps the tokens it generated, and it goes back to the *front* of
           the queue, to be prefilled again later over its prompt and those tokens. This
           repeats until the slot is found or the request itself was the victim; a request
           preempted for an older one is skipped. Decodes come before admissions and do not
           count against the token budget: a newcomer never takes the slot a running
           request needs.
        3. Prefills: queued requests join in queue order (preempted ones first, then by
           arrival) while fewer than ``max_num_seqs`` run, while their whole sequence (a
           cached prefix included) fits in what is left of ``max_prefill_tokens`` (the
           step's first prefill always fits, so a long prompt is never stuck), and while
           the memory admits them (:meth:`Memory.admit`; the ``paged`` policy admits only
           while a watermark of free blocks remains, so that running requests can grow
           for a while before someone is preempted). The first request that does not fit
           ends admission for this step: no later request overtakes it.
        4. Record: a :class:`~kvlib.serving.types.StepRecord` of the step is appended to
           :attr:`records`, with the memory's :meth:`Memory.breakdown` of the budget.

        Chapter 8's options change steps 2 and 3. With ``preemption_mode="swap"`` a victim's
        K/V go to the host pool (if it has room; else it is recomputed), and swapped-out
        requests come back, oldest first, before any queued request is admitted (none is
        while one is swapped out) and not at a step that preempted (unless nothing else
        runs), as in vLLM. With chunked prefill each decode counts one token of
        ``max_num_batched_tokens``; the rest goes to prompt chunks: first the prompt being
        prefilled (oldest first), then queued requests, each the chunk that fits.

        Returns the :class:`~kvlib.serving.types.StepPlan`: the prefills (with the tokens
        already cached, or the chunk's start) in admission order, then the decodes. An
        empty plan means nothing can run with this memory; the drivers raise then.
        """
        self._arrive(now)
        self._swaps = []
        num_preempted = self.num_preemptions + self.num_swaps
        decodes = self._grow_running()
        if self.swapped and (self.num_preemptions + self.num_swaps == num_preempted or not decodes):
            decodes += self._swap_in()
        if self.config.enable_chunked_prefill:
            prefills, ends = self._chunk_prefills(len(decodes))
        else:
            prefills, ends = ([] if self.swapped else self._admit_waiting()), None
        plan = StepPlan(tuple(prefills), tuple(decodes), prefill_ends=ends, swaps=tuple(self._swaps))
        self._record(now, plan)
        return plan

    def _grow_running(self) -> list[SeqState]:
        """Step 2 of :meth:`schedule`: a slot for each running request's newest token (or preemptions)."""
        decodes, preempted = [], set()
        for seq in list(self.running):
            if seq.seq_id in preempted or seq.seq_id in self.prefilling:
                continue  # preempted for an older request in this loop, or still being prefilled
            while not self.memory.append(seq):
                victim = self.victim(seq)
                self._preempt(victim)
                preempted.add(victim.seq_id)
                if victim is seq:
                    break
            else:
                decodes.append(seq)
                self.held += 1
        return decodes

    def victim(self, seq: SeqState) -> SeqState:
        """The running request to preempt so that ``seq`` gets a slot for its newest token.

        First come, first served (the default, as in vLLM): the youngest running request, the
        last of :attr:`running`; it may be ``seq`` itself. With a ``victim`` policy the policy
        picks instead, among the requests that may give their memory up: ``seq`` and every
        running request younger than it (the older ones already have their slot for this step),
        a tuple, oldest first, whose last element is the default's choice.
        """
        if self.victim_policy is None:
            return self.running[-1]
        candidates = tuple(self.running[self.running.index(seq) :])
        chosen = self.victim_policy(candidates)
        if not any(chosen is candidate for candidate in candidates):
            raise KVLibError(
                f"the victim policy returned {chosen!r}"[:100]
                + f" ({type(chosen).__name__}), not one of the {len(candidates)} running requests given to it"
            )
        return chosen

    def _swap_in(self) -> list[SeqState]:
        """Swapped-out requests back into memory, oldest first, while they fit: each decodes at once."""
        back = []
        while self.swapped and len(self.running) < self.config.max_num_seqs:
            seq = self.swapped[0]
            cached = self.memory.admit(seq)  # every token gets a slot, the newest included
            if cached is None:
                break
            del self.swapped[0]
            self._swaps.append(self.host.swap_in(seq.seq_id, cached))
            bisect.insort(self.running, seq, key=_priority)
            self.held += len(seq.tokens)
            back.append(seq)
        return back

    def _admit_waiting(self) -> list[tuple[SeqState, int]]:
        """Step 3 of :meth:`schedule`: queued requests, in order, while the limits and the memory allow."""
        prefills, budget = [], self.config.max_prefill_tokens
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if prefills and len(seq.tokens) > budget:
                break
            cached = self._admit(seq)
            if cached is None:
                break
            prefills.append((seq, cached))
            budget -= len(seq.tokens)
        return prefills

    def _admit(self, seq: SeqState) -> int | None:
        """The first queued request into memory and the running list; its cached tokens, or ``None``."""
        cached = self.memory.admit(seq)
        if cached is not None:
            self.waiting.popleft()
            bisect.insort(self.running, seq, key=_priority)
            self.held += len(seq.tokens)
        return cached

    def _chunk_prefills(self, num_decodes: int) -> tuple[list[tuple[SeqState, int]], list[int]]:
        """Step 3 with chunked prefill: the token budget left after the decodes, to prompt chunks in order."""
        budget = self.config.token_budget - num_decodes
        prefills, ends = [], []
        for seq in self.running:  # prompts being prefilled continue first, oldest first
            start = self.prefilling.get(seq.seq_id)
            if start is not None and budget > 0:
                prefills.append((seq, start))
                ends.append(min(len(seq.tokens), start + budget))
                budget -= ends[-1] - start
        while (
            budget > 0 and self.waiting and not self.swapped and len(self.running) < self.config.max_num_seqs
        ):
            seq = self.waiting[0]
            cached = self._admit(seq)
            if cached is None:
                break
            self.prefilling[seq.seq_id] = cached
            prefills.append((seq, cached))
            ends.append(min(len(seq.tokens), cached + budget))
            budget -= ends[-1] - cached
        return prefills, ends

    def _record(self, now: float, plan: StepPlan) -> None:
        """Step 4 of :meth:`schedule`: what the step computes and where every slot is."""
        head = self.waiting[0] if self.waiting else None
        self.records.append(
            StepRecord(  # positional, in StepRecord's field order: this runs at every simulated step
                now,
                plan.num_seqs,
                plan.num_prefill_tokens,
                plan.num_context_tokens,
                len(self.waiting) + len(self.swapped),
                self.held,
                len(plan.prefills),
                plan.num_seqs if plan.prefill_ends is None else len(plan.seqs),
                sum(plan.swaps),
                *self.memory.breakdown(self.held, head),  # one value per category of CATEGORIES
            )
        )

    def complete(self, plan: StepPlan, new_tokens: list, now: float) -> None:
        """Record the new tokens of each planned sequence that gets some (prefills first, then decodes),
        at time ``now``.

        ``new_tokens[i]`` is the token of ``plan.seqs[i]``, or a list of its tokens (speculative
        decoding, chapter 8: all but the last already have slots, given by the decoder); tokens
        past the request's output length are dropped. The last token goes to the end of
        ``seq.tokens`` without a slot (it gets one at the next step's :meth:`schedule`); a
        request that has generated its output length finishes: its memory is released and it
        moves to :attr:`finished`. A partial prefill's progress is recorded.
        """
        if plan.prefill_ends is not None:
            for seq, _, end in plan.chunks:
                if end < len(seq.tokens):
                    self.prefilling[seq.seq_id] = end
                else:
                    self.prefilling.pop(seq.seq_id, None)
        num_new = 0
        for seq, token in zip(plan.seqs, new_tokens, strict=True):
            if isinstance(token, list):
                token = token[: seq.request.output_len - seq.num_generated]
                if not token:
                    raise KVLibError(f"sequence {seq.seq_id}: a step must give it at least one new token")
                seq.tokens += token
                self.held += len(token) - 1
                num_new += len(token)
            else:
                seq.tokens.append(token)
                num_new += 1
            seq.num_generated = len(seq.tokens) - seq.request.prompt_len
            if seq.first_token_s is None:
                seq.first_token_s = now
            if seq.num_generated == seq.request.output_len:
                seq.finish_s = now
                self.running.remove(seq)
                self.memory.release(seq)
                self.held -= len(seq.tokens) - 1
                self.finished.append(seq)
        if self.records and num_new != self.records[-1].new_tokens:
            self.records[-1] = replace(self.records[-1], new_tokens=num_new)
