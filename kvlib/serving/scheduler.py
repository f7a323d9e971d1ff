"""Which requests run at each step: first come, first served, continuous batching, and
preemption by recomputation (chapter 4).

The :class:`Scheduler` works with any memory of :mod:`kvlib.placement`. At every step
finished requests have left and waiting ones join (continuous, or iteration-level,
batching); a waiting request never overtakes an earlier one, and no request is dropped.
:func:`kvlib.simulator.simulate` drives it with a step-time model instead of a model;
:func:`kvlib.engine.run_engine` drives it with ``kvlib.model``.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from kvlib.serving.traces import Request
from kvlib.serving.types import SeqState, StepPlan


def _priority(seq: SeqState) -> tuple[float, int]:
    """First come, first served: earlier arrivals run first and are preempted last."""
    return seq.request.arrival_s, seq.request.req_id


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one step, as in vLLM: at most ``max_num_seqs`` sequences, and at most
    ``max_prefill_tokens`` prompt tokens prefilled per step (at least one prompt always fits)."""

    max_num_seqs: int = 256
    max_prefill_tokens: int = 2048


class Scheduler:
    """First come, first served, continuous batching, preemption by recomputation.

    Each :meth:`schedule` call plans one step. First every running request gets a slot
    for its newest token, oldest first; if memory is out, the youngest running request
    is preempted (its memory freed, and it goes back to the front of the queue, to be
    prefilled again over its prompt and the tokens it already generated). Then waiting
    requests join in arrival order while they fit. :meth:`complete` records the tokens a
    step produced and retires finished requests.
    """

    def __init__(self, memory, requests: list[Request], config: SchedulerConfig = SchedulerConfig()):
        self.memory, self.config = memory, config
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.req_id)))  # not arrived yet
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []
        self.finished: list[SeqState] = []
        self.num_preemptions = 0
        self.preempted_generated: list[
            int
        ] = []  # per preemption: tokens the victim had generated (to be recomputed)
        self.held = 0  # slots holding tokens, over running requests
        self.records: list[tuple] = []  # per step: see STEP_FIELDS

    def has_work(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    def next_arrival(self) -> float:
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
        self._arrive(now)
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
        head = self.waiting[0] if self.waiting else None
        plan = StepPlan(prefills, decodes)
        self.records.append(
            (
                now,
                plan.num_seqs,
                plan.num_prefill_tokens,
                plan.num_context_tokens,
                len(self.waiting),
                self.held,
                len(prefills),
                *self.memory.breakdown(self.held, head),
            )
        )
        return plan

    def complete(self, plan: StepPlan, new_tokens: list[int], now: float) -> None:
        """Record one new token per planned sequence (prefills first, then decodes), at time ``now``."""
        for seq, token in zip(plan.seqs, new_tokens):
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
