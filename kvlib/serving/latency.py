"""Latency as a serving engineer reads it (chapters 4 and 8): time to first token, time per
output token, the gaps between tokens, their percentiles, and goodput under a latency target.

The vLLM paper (Kwon et al. 2023) compares systems by one number, the *normalised latency*:
each request's time from arrival to its last token over its output tokens, averaged over
requests (:attr:`~kvlib.serving.results.RunResult.normalized_latency`). Engines today report
delays per request instead, because users feel them: the wait before the first token, TTFT
(:attr:`~kvlib.serving.results.RunResult.ttft_s`), and the pace after it, TPOT
(:attr:`~kvlib.serving.results.RunResult.tpot_s`), and beside them the gaps between tokens,
ITL (:func:`inter_token_latencies`), each at the median and at the 99th percentile.
:func:`latency_summary` computes them for any :class:`RunResult`, simulated or served by the
real engine, as vLLM's ``benchmarks/benchmark_serving.py`` does:

- TTFT = first token's time - arrival, one value per request;
- TPOT = (last token's time - first token's time) / (output tokens - 1), one value per request
  of more than one output token: its mean gap; percentiles over requests;
- ITL = every gap between two consecutive tokens of a request, one value per gap, of all
  requests together: percentiles over gaps. A request's long stall is one gap among many, so the
  ITL's p99 shows stalls that a request's mean (its TPOT) spreads thin;
- percentiles by :func:`numpy.percentile` with its default (linear) interpolation.

:func:`goodput` counts the requests that meet *both* a TTFT and a TPOT target (a request of one
output token meets any TPOT target, as in vLLM, which counts its TPOT as 0): how many requests
per second the server serves well, not merely serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlib import KVLibError
from kvlib.serving.results import RunResult


@dataclass(frozen=True)
class LatencySummary:
    """Per-request latencies of one run, summarised (seconds; percentiles linear, numpy's default)."""

    num_requests: int  # finished requests: each has a TTFT
    num_tpot_requests: int  # of them, those with more than one output token: each has a TPOT
    ttft_mean_s: float  # time to first token, mean over requests
    ttft_p50_s: float  # its median
    ttft_p99_s: float  # its 99th percentile
    tpot_mean_s: float  # time per output token after the first, mean over requests (NaN: none has two)
    tpot_p50_s: float  # its median (NaN: no request has two tokens)
    tpot_p99_s: float  # its 99th percentile (NaN: no request has two tokens)
    num_itl_gaps: int  # gaps between consecutive tokens of a request, all requests together
    itl_mean_s: float  # inter-token latency, mean over the gaps (NaN: no gaps)
    itl_p50_s: float  # its median over the gaps (NaN: no gaps)
    itl_p99_s: float  # its 99th percentile over the gaps (NaN: no gaps)
    normalized_latency_s: float  # the paper's measure: mean of (finish - arrival) / output tokens


@dataclass(frozen=True)
class Goodput:
    """The requests of a run that meet both latency targets (a TTFT and a TPOT)."""

    ttft_slo_s: float  # the time-to-first-token target (seconds): met when TTFT <= it
    tpot_slo_s: float  # the time-per-output-token target (seconds): met when TPOT <= it
    num_good: int  # requests meeting both targets
    num_requests: int  # finished requests
    makespan_s: float  # seconds from the first arrival to the end of the last step

    @property
    def share(self) -> float:
        """Share of the requests meeting both targets."""
        return self.num_good / self.num_requests

    @property
    def requests_per_s(self) -> float:
        """Goodput: requests meeting both targets per second of the run."""
        return self.num_good / self.makespan_s


def _checked(run) -> RunResult:
    if not isinstance(run, RunResult):
        raise KVLibError(f"latencies need a RunResult, not {type(run).__name__}")
    if not run.finished:
        raise KVLibError("the run has no finished requests: no latency to summarise")
    return run


def _percentiles(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, p50, p99) of ``values``; NaN for each when there are none."""
    if values.size == 0:
        return math.nan, math.nan, math.nan
    p50, p99 = np.percentile(values, [50, 99])  # linear interpolation, numpy's default (and vLLM's)
    return float(values.mean()), float(p50), float(p99)


def inter_token_latencies(run: RunResult) -> np.ndarray:
    """Seconds between consecutive tokens of a request, one per decode of every step (1-D).

    A decode's token comes at the end of its step, the previous one at the end of the step
    before it ran; when the request decodes at every step, the gap is the step's duration.
    Each step counts once per sequence it decodes (``num_seqs - num_prefills``).

    The steps do not record one kind of gap: a preempted request's wait from its last token
    before the preemption to the token its recomputation (a prefill) yields. Those gaps, one per
    preemption, are left out here; the request's TPOT counts them.
    """
    if not isinstance(run, RunResult):
        raise KVLibError(f"run must be a RunResult (simulate, run_engine), not {type(run).__name__}")
    steps = run.steps
    decodes = (steps["num_seqs"] - steps["num_prefills"]).astype(np.int64)  # (steps,)
    return np.repeat(steps["duration_s"], decodes)


def latency_summary(run: RunResult) -> LatencySummary:
    """TTFT and TPOT (mean, p50, p99 over requests), ITL (over the gaps between tokens) and the
    normalised latency of a run's requests."""
    run = _checked(run)
    ttft, tpot, gaps = run.ttft_s, run.tpot_s, inter_token_latencies(run)
    tpot = tpot[~np.isnan(tpot)]  # (requests with > 1 output token,)
    return LatencySummary(
        len(ttft),
        len(tpot),
        *_percentiles(ttft),
        *_percentiles(tpot),
        len(gaps),
        *_percentiles(gaps),
        run.normalized_latency,
    )


def _checked_slo(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or math.isnan(value):
        raise KVLibError(f"{name} must be a number of seconds > 0 (inf: no target), not {value!r}")
    return float(value)


def goodput(run: RunResult, ttft_slo_s: float, tpot_slo_s: float) -> Goodput:
    """The requests of ``run`` whose TTFT is at most ``ttft_slo_s`` and whose TPOT is at most
    ``tpot_slo_s`` (seconds; ``inf`` drops a target), and their rate over the run's makespan."""
    run = _checked(run)
    ttft_slo_s, tpot_slo_s = _checked_slo(ttft_slo_s, "ttft_slo_s"), _checked_slo(tpot_slo_s, "tpot_slo_s")
    tpot = np.nan_to_num(run.tpot_s, nan=0.0)  # one output token: no gap, TPOT 0 (as vLLM counts it)
    good = (run.ttft_s <= ttft_slo_s) & (tpot <= tpot_slo_s)
    return Goodput(ttft_slo_s, tpot_slo_s, int(good.sum()), len(good), run.makespan_s)
