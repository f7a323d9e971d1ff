"""What one serving run reports (chapter 4): :class:`RunResult`, built from the scheduler's
per-step records by :func:`result_from`.

The simulator (:func:`kvlib.serving.simulator.simulate`) and the real engine
(:func:`kvlib.serving.engine.run_engine`) both return a :class:`RunResult`: the finished
requests, and one array per field of :class:`~kvlib.serving.types.StepRecord` (plus each
step's duration), from which it computes the chapter's numbers: the share of the KV budget
in each category of :data:`~kvlib.serving.types.CATEGORIES`, the batch, throughput and
latency (the paper's normalised latency, and each request's time to first token and time per
output token, which :mod:`kvlib.serving.latency` summarises with the gaps between tokens), and
the same steps retimed by another step-time model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from operator import attrgetter

import numpy as np

from kvlib import KVLibError
from kvlib.serving.scheduler import Scheduler, SchedulerConfig
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.types import CATEGORIES, SeqState, StepRecord


@dataclass
class RunResult:
    """One serving run (simulated or real): the finished requests and one record per step."""

    policy: str  # the memory policy (one of kvlib.serving.placement.POLICIES)
    num_slots: int  # token slots of the KV budget
    finished: list[SeqState]  # every request, by id, with its tokens and times
    # per step, (steps,) float64 each: the fields of StepRecord, "duration_s" (seconds), and for
    # the real engine "clock_s" (the same steps on its clock)
    steps: dict[str, np.ndarray]
    num_preemptions: int
    # (preemptions,) int64: the tokens each preempted request had generated, which its
    # recomputation prefills again with its prompt
    preempted_generated: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def makespan_s(self) -> float:
        """Seconds from the first arrival to the end of the last step."""
        return float(
            self.steps["start_s"][-1]
            + self.steps["duration_s"][-1]
            - min(s.request.arrival_s for s in self.finished)
        )

    def _busy(self) -> np.ndarray:
        """Steps while some request waits: the server is short of memory, not of work."""
        busy = self.steps["num_waiting"] > 0
        return busy if busy.any() else np.ones_like(busy)

    def memory_shares(self) -> dict[str, float]:
        """Share of the budget in each category, sampled at every step while requests wait,
        averaged over those steps."""
        busy = self._busy()
        return {c: float(self.steps[c][busy].mean()) / self.num_slots for c in CATEGORIES}

    @property
    def utilisation(self) -> float:
        """Share of the KV budget holding real tokens (the paper's "token states"), while requests wait."""
        return self.memory_shares()["tokens"]

    @property
    def stored_per_held(self) -> float:
        """Slots storing tokens per token the running requests hold (a shared token counted once
        per request), while requests wait: 1 without sharing, lower as prefix caching shares
        blocks (chapter 4: the memory a request needs with sharing, over without)."""
        busy = self._busy()
        return float(self.steps["tokens"][busy].sum() / self.steps["held_tokens"][busy].sum())

    @property
    def mean_batch(self) -> float:
        """Sequences per step, averaged over the steps while requests wait."""
        return float(self.steps["num_seqs"][self._busy()].mean())

    @property
    def largest_batch(self) -> int:
        """Most sequences of any step (the scheduler's ``max_num_seqs`` at most)."""
        return int(self.steps["num_seqs"].max())

    @property
    def forward_passes(self) -> int:
        """Forward passes of the real engine's schedule: one per prefilled prompt, and one per step
        for all decoding sequences (:func:`kvlib.serving.engine.execute`). When every pass costs the same
        (a tiny model on a GPU, bound by kernel launches), wall time follows this count (chapter 4)."""
        prefills = self.steps["num_prefills"]
        return int(prefills.sum() + np.count_nonzero(self.steps["num_seqs"] > prefills))

    def at_cap(self, max_num_seqs: int = SchedulerConfig().max_num_seqs) -> tuple[float, float, float]:
        """(share of the steps while requests wait that run ``max_num_seqs`` sequences, the budget's free
        share in those steps, and in the others): where the scheduler's cap, not memory, stops admission
        (chapter 4). A share is 0.0 when there are no such steps."""
        busy = self._busy()
        capped = busy & (self.steps["num_seqs"] >= max_num_seqs)

        def free(steps):
            return float(self.steps["free"][steps].mean()) / self.num_slots if steps.any() else 0.0

        return float(capped.sum() / busy.sum()), free(capped), free(busy & ~capped)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second while requests wait: the server's capacity.

        It counts the tokens each step generated (``new_tokens``), which equal the sequences
        it computed unless a chunk of a prompt produced none or speculative decoding produced
        several (chapter 8)."""
        busy = self._busy()
        return float(self.steps["new_tokens"][busy].sum() / self.steps["duration_s"][busy].sum())

    @property
    def requests_per_s(self) -> float:
        """Capacity in requests per second: tokens per second over the mean output length."""
        return self.tokens_per_s / float(np.mean([s.request.output_len for s in self.finished]))

    @property
    def normalized_latency(self) -> float:
        """Mean over requests of (finish - arrival) / output tokens: seconds per output token."""
        return float(
            np.mean([(s.finish_s - s.request.arrival_s) / s.request.output_len for s in self.finished])
        )

    @property
    def ttft_s(self) -> np.ndarray:
        """(requests,) time to first token of each finished request, by id: its first output token's
        time minus its arrival (seconds). A preempted request keeps the time of its first token."""
        return np.array([_time_of(s, "first_token_s") - s.request.arrival_s for s in self.finished])

    @property
    def tpot_s(self) -> np.ndarray:
        """(requests,) time per output token after the first, by id: (last token - first token) /
        (output tokens - 1), vLLM's TPOT: one value per request, the mean of its gaps between
        tokens. The gaps themselves, each one value (vLLM's ITL, inter-token latency), are
        :func:`kvlib.serving.latency.inter_token_latencies`. NaN for a request of one output
        token, which has no gap."""
        return np.array(
            [
                (_time_of(s, "finish_s") - _time_of(s, "first_token_s")) / (s.request.output_len - 1)
                if s.request.output_len > 1
                else np.nan
                for s in self.finished
            ]
        )

    def retimed(self, step_model: StepTimeModel) -> RunResult:
        """The same steps timed by another step-time model (see :meth:`with_durations`)."""
        steps = self.steps
        return self.with_durations(
            step_model.predict(steps["num_seqs"], steps["context_tokens"], steps["prefill_tokens"])
        )

    def with_durations(self, durations) -> RunResult:
        """The same steps, back to back, with the given durations (one per step).

        Exact when every request arrived at time 0 (a saturated server): the scheduler's
        choices then do not depend on time, only the durations change, and every request's
        first and last token come at the end of the same steps as before.
        """
        if any(s.request.arrival_s > 0 for s in self.finished):
            raise KVLibError("retiming needs a run in which every request arrived at time 0")
        steps = self.steps
        durations = np.asarray(durations, dtype=np.float64)
        if durations.shape != steps["duration_s"].shape:
            raise KVLibError(
                f"{durations.size} durations given for a run of {steps['duration_s'].size} steps"
            )
        old_ends, new_ends = steps["start_s"] + steps["duration_s"], np.cumsum(durations)

        def moved(times):
            return new_ends[np.clip(np.searchsorted(old_ends, times), 0, len(new_ends) - 1)].tolist()

        firsts, lasts = (
            moved([s.first_token_s for s in self.finished]),
            moved([s.finish_s for s in self.finished]),
        )
        finished = [
            replace(s, first_token_s=f, finish_s=t)
            for s, f, t in zip(self.finished, firsts, lasts, strict=True)
        ]
        return RunResult(
            self.policy,
            self.num_slots,
            finished,
            dict(steps, start_s=new_ends - durations, duration_s=durations),
            self.num_preemptions,
            self.preempted_generated,
        )


def _time_of(seq: SeqState, name: str) -> float:
    """``seq``'s ``first_token_s`` or ``finish_s``, refusing a request that never produced it."""
    value = getattr(seq, name)
    if value is None:
        raise KVLibError(f"request {seq.seq_id} has no {name}: latencies need finished requests")
    return float(value)


def result_from(scheduler: Scheduler, policy: str, durations: list[float]) -> RunResult:
    """Collect a finished scheduler's records into a :class:`RunResult`: one float64 array per
    field of :class:`StepRecord`, and ``durations`` (one per step, seconds) as ``"duration_s"``."""
    names = [f.name for f in fields(StepRecord)]
    rows = list(map(attrgetter(*names), scheduler.records))
    records = np.array(rows, dtype=np.float64).reshape(-1, len(names))  # (steps, fields)
    steps = {name: records[:, i] for i, name in enumerate(names)}
    steps["duration_s"] = np.array(durations)
    return RunResult(
        policy,
        scheduler.memory.num_slots,
        sorted(scheduler.finished, key=lambda s: s.seq_id),
        steps,
        scheduler.num_preemptions,
        np.array(scheduler.preempted_generated, dtype=np.int64),
    )
