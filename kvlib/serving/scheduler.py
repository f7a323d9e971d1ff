"""Which requests run at each step: first come, first served, continuous batching, and
preemption by recomputation (chapter 4).

The :class:`Scheduler` works with any memory that keeps the :class:`~kvlib.serving.types.Memory`
contract (the policies of :mod:`kvlib.serving.placement`). At every step finished requests
have left and waiting ones join (continuous, or iteration-level, batching); a waiting
request never overtakes an earlier one, and no request is dropped.
:func:`kvlib.serving.simulator.simulate` drives it with a step-time model instead of a
model; :func:`kvlib.serving.engine.run_engine` drives it with :mod:`kvlib.model`.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from kvlib.serving.arguments import require_count
from kvlib.serving.traces import Request
from kvlib.serving.types import Memory, SeqState, StepPlan, StepRecord


def _priority(seq: SeqState) -> tuple[float, int]:
    """First come, first served: earlier arrivals run first and are preempted last."""
    return seq.request.arrival_s, seq.request.req_id


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one step, as in vLLM (at least one prompt always fits)."""

    max_num_seqs: int = 256  # sequences running at once (decoding or being prefilled)
    max_prefill_tokens: int = 2048  # tokens of the prompts admitted at one step, their cached prefix included

    def __post_init__(self):
        # 0 sequences would run nothing, ever: name it here rather than as "a request never fits"
        require_count(self.max_num_seqs, "max_num_seqs")
        require_count(self.max_prefill_tokens, "max_prefill_tokens")


class Scheduler:
    """First come, first served, continuous batching, preemption by recomputation.

    Each :meth:`schedule` call plans one step; :meth:`complete` records the tokens the step
    produced and retires finished requests. The driver (the simulator or the real engine)
    keeps the clock and runs the plans.
    """

    def __init__(self, memory: Memory, requests: list[Request], config: SchedulerConfig = SchedulerConfig()):
        self.memory, self.config = memory, config
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.req_id)))  # not arrived yet
        self.waiting: deque[SeqState] = deque()  # arrived, not running; preempted ones at the front
        self.running: list[SeqState] = []  # in priority order: oldest first
        self.finished: list[SeqState] = []  # in finishing order
        self.num_preemptions = 0
        self.preempted_generated: list[int] = []  # per preemption: tokens the victim had generated
        self.held = 0  # slots holding tokens, over running requests
        self.records: list[StepRecord] = []  # one per schedule() call

    def has_work(self) -> bool:
        """Is any request not finished (not arrived yet, waiting or running)?"""
        return bool(self.pending or self.waiting or self.running)

    def next_arrival(self) -> float:
        """When the next request that has not arrived yet arrives (``inf`` if none is left)."""
        return self.pending[0].arrival_s if self.pending else math.inf

    def _arrive(self, now: float) -> None:
        while self.pending and self.pending[0].arrival_s <= now:
            request = self.pending.popleft()
            self.waiting.append(SeqState(request, list(request.prompt)))

    def _preempt(self, seq: SeqState) -> None:
        self.running.remove(seq)
        self.memory.release(seq)
        self.held -= len(seq.tokens) - 1
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.preempted_generated.append(seq.num_generated)
        self.waiting.appendleft(seq)

    def schedule(self, now: float) -> StepPlan:
        """Plan the step that starts at ``now``: which sequences decode, which are prefilled.

        1. Arrivals: every request with ``arrival_s <= now`` joins the back of the queue.
        2. Decodes: each running request, oldest first (arrival time, then id), asks the
           memory for a slot for its newest token (:meth:`Memory.append`). When the memory
           has none, the youngest running request is preempted by recomputation: its
           memory is released, it keeps the tokens it generated, and it goes back to the
           *front* of the queue, to be prefilled again later over its prompt and those
           tokens. This repeats until the slot is found or the request itself was the
           victim; a request preempted for an older one is skipped. Decodes come before
           admissions and do not count against the token budget: a newcomer never takes
           the slot a running request needs.
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

        Returns the :class:`~kvlib.serving.types.StepPlan`: the prefills (with the tokens
        already cached) in admission order, then the decodes, oldest first. An empty plan
        means nothing can run with this memory; the drivers raise then.
        """
        self._arrive(now)
        decodes = self._grow_running()
        prefills = self._admit_waiting()
        plan = StepPlan(tuple(prefills), tuple(decodes))
        self._record(now, plan)
        return plan

    def _grow_running(self) -> list[SeqState]:
        """Step 2 of :meth:`schedule`: a slot for each running request's newest token (or preemptions)."""
        decodes, preempted = [], set()
        for seq in list(self.running):
            if seq.seq_id in preempted:
                continue  # preempted for an older request in this loop
            while not self.memory.append(seq):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.add(victim.seq_id)
                if victim is seq:
                    break
            else:
                decodes.append(seq)
                self.held += 1
        return decodes

    def _admit_waiting(self) -> list[tuple[SeqState, int]]:
        """Step 3 of :meth:`schedule`: queued requests, in order, while the limits and the memory allow."""
        prefills, budget = [], self.config.max_prefill_tokens
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if prefills and len(seq.tokens) > budget:
                break
            cached = self.memory.admit(seq)
            if cached is None:
                break
            self.waiting.popleft()
            bisect.insort(self.running, seq, key=_priority)
            prefills.append((seq, cached))
            budget -= len(seq.tokens)
            self.held += len(seq.tokens)
        return prefills

    def _record(self, now: float, plan: StepPlan) -> None:
        """Step 4 of :meth:`schedule`: what the step computes and where every slot is."""
        head = self.waiting[0] if self.waiting else None
        self.records.append(
            StepRecord(  # positional, in StepRecord's field order: this runs at every simulated step
                now,
                plan.num_seqs,
                plan.num_prefill_tokens,
                plan.num_context_tokens,
                len(self.waiting),
                self.held,
                len(plan.prefills),
                *self.memory.breakdown(self.held, head),  # one value per category of CATEGORIES
            )
        )

    def complete(self, plan: StepPlan, new_tokens: list[int], now: float) -> None:
        """Record one new token per planned sequence (prefills first, then decodes), at time ``now``.

        The token goes to the end of ``seq.tokens`` (it gets its slot at the next step's
        :meth:`schedule`); a request that has generated its output length finishes: its
        memory is released and it moves to :attr:`finished`.
        """
        for seq, token in zip(plan.seqs, new_tokens, strict=True):
            seq.tokens.append(token)
            seq.num_generated = len(seq.tokens) - seq.request.prompt_len
            if seq.first_token_s is None:
                seq.first_token_s = now
            if seq.num_generated == seq.request.output_len:
                seq.finish_s = now
                self.running.remove(seq)
                self.memory.release(seq)
                self.held -= len(seq.tokens) - 1
                self.finished.append(seq)
