"""How long one serving step takes (chapter 4): :class:`StepTimeModel` and its fit to measured steps.

Every step of a real engine runs one forward pass over the sequences the scheduler
picked. :class:`StepTimeModel` predicts its duration from what it computes,

    t_step = fixed_s + per_seq_s x sequences + per_context_s x context tokens read
             + per_prefill_s x prompt tokens prefilled,

the sum of its parts: what a CPU step does, one operation after another. The simulator
(:func:`kvlib.serving.simulator.simulate`) uses it as its clock. :func:`fit_step_time` fits the
constants to measured steps of :mod:`kvlib.model` (:func:`kvlib.serving.calibration.calibrate`
measures them). A GPU overlaps reading memory with computing, so
:func:`kvlib.serving.roofline.roofline_step` derives an ``overlapped`` model from a data sheet:
a step takes the larger of its memory part (the weights, the cached tokens, each sequence's fixed
state) and its compute part (each sequence's and each prompt token's arithmetic), as on a
roofline. A memory-bound decode step then absorbs prompt tokens for free, which chunked prefill
exploits (chapter 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlib import KVLibError
from kvlib.checks import require_real
from kvlib.serving.types import StepPlan

TERMS = ("fixed_s", "per_seq_s", "per_context_s", "per_prefill_s")  # StepTimeModel's constants, in order


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds of one step: a fixed part, plus parts per sequence, per context token read and
    per prompt token prefilled."""

    fixed_s: float  # seconds every step takes (reading the weights, launching the kernels)
    per_seq_s: float  # seconds per sequence computed
    per_context_s: float  # seconds per cached token a decoding sequence reads
    per_prefill_s: float  # seconds per prompt token prefilled
    source: str = ""  # where the constants come from (a calibration, a data sheet)
    # a step takes the larger of its memory part (fixed_s, per_context_s, per_seq_memory_s) and its
    # compute part (per_seq_s, per_prefill_s), as on a roofline (a GPU), instead of their sum (a CPU)
    overlapped: bool = False
    per_seq_memory_s: float = 0.0  # seconds per sequence of memory traffic (a fixed state read and written)

    def __post_init__(self):
        # a negative or NaN constant gives negative or NaN step times, and throughput of the same sign
        for term in (*TERMS, "per_seq_memory_s"):
            require_real(getattr(self, term), f"StepTimeModel.{term} (seconds)")
        if not isinstance(self.overlapped, bool):
            raise KVLibError(f"StepTimeModel.overlapped must be True or False, not {self.overlapped!r}")

    def predict(self, num_seqs, num_context_tokens, num_prefill_tokens):
        """Seconds of steps with these counts (numbers or arrays of one shape: one step each).

        Each count must be real and >= 0 (a one-line KVLibError naming it otherwise): a negative
        count would give a step shorter than its fixed part, a NaN a NaN time."""
        num_seqs = counts(num_seqs, "num_seqs")
        memory = (
            self.fixed_s
            + self.per_context_s * counts(num_context_tokens, "num_context_tokens")
            + self.per_seq_memory_s * num_seqs
        )
        compute = self.per_seq_s * num_seqs + self.per_prefill_s * counts(
            num_prefill_tokens, "num_prefill_tokens"
        )
        return np.maximum(memory, compute) if self.overlapped else memory + compute

    def step_s(self, plan: StepPlan) -> float:
        """Seconds of one planned step (plain arithmetic: the simulator calls this at every step)."""
        memory = (
            self.fixed_s
            + self.per_context_s * plan.num_context_tokens
            + self.per_seq_memory_s * plan.num_seqs
        )
        compute = self.per_seq_s * plan.num_seqs + self.per_prefill_s * plan.num_prefill_tokens
        return max(memory, compute) if self.overlapped else memory + compute

    def largest_batch_within(self, seconds: float, context_tokens_per_seq: float) -> int:
        """The most decoding sequences, each reading ``context_tokens_per_seq`` cached tokens, whose
        step takes at most ``seconds`` (0 when even the fixed part takes longer)."""
        require_real(seconds, "seconds")
        require_real(context_tokens_per_seq, "context_tokens_per_seq")
        memory_per_seq = self.per_context_s * context_tokens_per_seq + self.per_seq_memory_s
        if self.overlapped:
            bounds = [(seconds - self.fixed_s) / memory_per_seq if memory_per_seq else math.inf]
            bounds.append(seconds / self.per_seq_s if self.per_seq_s else math.inf)
        else:
            per_seq = memory_per_seq + self.per_seq_s
            bounds = [(seconds - self.fixed_s) / per_seq if per_seq else math.inf]
        if seconds < self.fixed_s:
            return 0
        return max(0, math.floor(min(bounds)))

    def fixed_share(self, num_seqs: float, num_context_tokens: float) -> float:
        """Share of a decode step that does not grow with the batch (near 1: bigger batches are free).

        The counts may be averages over a run (chapter 4's operating point): real numbers >= 0,
        checked by :meth:`predict`."""
        return self.fixed_s / float(self.predict(num_seqs, num_context_tokens, 0))


def counts(values, name: str) -> np.ndarray:
    """``values`` (a number or an array of them) as a float array of counts, each real and >= 0."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise KVLibError(f"{name} must be a count or an array of counts, not {values!r}"[:200]) from None
    if not bool(np.all(array >= 0)) or not bool(np.all(np.isfinite(array))):  # NaN fails both
        raise KVLibError(f"{name} must be finite counts >= 0, not {values!r}"[:200])
    return array


def fit_step_time(
    num_seqs, num_context_tokens, num_prefill_tokens, seconds, source: str = ""
) -> StepTimeModel:
    """Least-squares fit of :class:`StepTimeModel` to measured steps, every constant >= 0.

    The fit weighs each step by 1 / seconds (relative errors), so that short steps count as
    much as long ones. A term whose best value would be negative is dropped (set to 0) and
    the others refitted: no step gets faster by doing more work.
    """
    try:
        counts = [
            np.asarray(x, dtype=np.float64).reshape(-1)
            for x in (num_seqs, num_context_tokens, num_prefill_tokens)
        ]
        seconds = np.asarray(seconds, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise KVLibError(
            "fit_step_time needs numbers: counts of sequences, tokens and measured seconds"
        ) from None
    columns = [np.ones(len(seconds)), *counts]
    if len(seconds) < 4 or any(len(c) != len(seconds) for c in columns) or not np.all(seconds > 0):
        raise KVLibError(
            "fit_step_time needs at least 4 measured steps with positive times, and equal-length inputs"
        )
    if not all(np.all(np.isfinite(c)) and np.all(c >= 0) for c in [*columns, seconds]):
        raise KVLibError("fit_step_time needs finite, non-negative counts and times (no NaN, no inf)")
    active = list(range(4))
    while True:
        design = np.stack([columns[i] for i in active], axis=1) / seconds[:, None]
        coef, *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
        if coef.min() >= 0 or len(active) == 1:
            break
        del active[int(np.argmin(coef))]
    values = dict.fromkeys(range(4), 0.0) | {i: max(0.0, float(c)) for i, c in zip(active, coef, strict=True)}
    return StepTimeModel(*(values[i] for i in range(4)), source=source)
