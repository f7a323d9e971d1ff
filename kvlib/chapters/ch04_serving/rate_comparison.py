"""The vLLM paper's comparison (chapter 4): the request rate each policy sustains at equal latency.

Kwon et al. (2023, Section 6.2 and Figure 12) plot each system's normalised latency (seconds
per output token, averaged over requests) against the request rate: flat at first, then
rising steeply once the rate passes what the server can serve, because the queue then grows
for as long as requests keep coming. They compare systems by the rates at which their curves
rise ("similar latencies"). We simulate the same with the A100 OPT-13B step model
(:func:`~kvlib.serving.roofline.roofline_step_model`: a step takes the larger of its memory and
compute times; arithmetic on the data sheet, deterministic), in the KV budget of
OPT-13B on that GPU (:func:`~kvlib.serving.roofline.kv_budget`), on the ShareGPT-like and
Alpaca-like traces, Poisson arrivals, seeded.

**The rule.** A trace's *unloaded latency* is its normalised latency when every request is
alone on the server: one prefill step, then one decode step of batch 1 per further token
(:func:`unloaded_latency`; the simulator gives exactly this at a vanishing rate). The
threshold is :data:`THRESHOLD_MULTIPLE` times it, the same for every policy on one trace. A
policy *sustains* the rate at which its curve first rises above the threshold, interpolated
between the two grid points around the crossing, linearly in log rate and log latency
(:func:`crossing_rate`). The multiple is 3 because batching alone slows a step, without any
queue: at paged's saturated operating point a step of the A100 model takes more than one and
a half times a solo step on either trace (its batch reads more cache and computes more prompts),
and a request's first token waits for its prefill besides. A threshold near that would measure
how slow a full batch is, not where the queue starts to grow; far above it, it measures how long
the trace is (the queue a finite trace builds above capacity). From 2 to 5 times, the
ShareGPT-like ratios move by a few percent (chapter 4 prints how much).

A finite trace favours the faster server a little: above capacity its queue grows by the
excess rate, and over the same number of requests a server of higher capacity piles up fewer
seconds of waiting, so it crosses an absolute threshold at a larger share of its capacity
(chapter 4 shows each policy's). The longer the trace, the
nearer every crossing comes to capacity, and the ratios to those of the saturated capacities
(chapter 4's throughput ratios). A trace so short that a saturated run's normalised latency
stays under the threshold never crosses it at any rate: :func:`rate_ratios` then says so.

**The grids.** Each policy's rates are :data:`RATE_FRACTIONS` of its own saturated capacity
(every request queued at time 0, :attr:`~kvlib.serving.results.RunResult.requests_per_s`):
one point in the flat part, most near the knee (0.8 to 1.35 of capacity), where a finite
trace crosses the threshold (just above capacity: the queue needs time to build). If the last
point is still below the threshold, the sweep adds rates 1.25 times apart (at most three).

**The size.** 400 ShareGPT-like and 1,500 Alpaca-like requests (as chapter 4's latency
curves), ten rates per policy: the two-trace sweep takes about 20 s on one core. Fewer
requests blur the knee (a short trace ends before its queue grows), more cost time
proportionally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from tqdm.auto import tqdm

from kvlib import KVLibError
from kvlib.chapters.ch04_serving.policy_comparison import PAPER_RATE_VS_MAX, PAPER_RATE_VS_ORACLE
from kvlib.serving.latency import latency_summary
from kvlib.serving.placement import POLICIES
from kvlib.serving.results import RunResult
from kvlib.serving.roofline import kv_budget, roofline_step_model
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import ALPACA, SHAREGPT, TraceSpec, make_trace

THRESHOLD_MULTIPLE = 3.0  # the latency threshold, in multiples of the trace's unloaded latency

RATE_FRACTIONS = (0.25, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.25, 1.35)  # of a policy's capacity

MAX_EXTENSIONS = 3  # rates the sweep may add, 1.25 times apart, above a grid that ends below the threshold

TRACE_SIZES = ((SHAREGPT, 400), (ALPACA, 1500))  # each trace and its number of requests

# The paper's ratios of sustained rates (vLLM / Orca-Oracle, vLLM / Orca-Max), per trace. For the
# Alpaca trace (Figure 12's lower row) the paper gives no ratio in the text: it says the results
# follow the ShareGPT trend, with a smaller advantage over Orca-Oracle and Orca-Pow2 for OPT-175B.
PAPER_BATCH_VS_ORACLE = 2.2  # requests batched at once, vLLM / Orca-Oracle (Figure 13a, OPT-13B, ShareGPT)

PAPER_BATCH_VS_MAX = 4.3  # vLLM / Orca-Max (the same)

PAPER_RATE_BANDS = {
    SHAREGPT.name: {"oracle": PAPER_RATE_VS_ORACLE, "max": PAPER_RATE_VS_MAX},
    ALPACA.name: {},
}


def unloaded_latency(requests, step_model: StepTimeModel) -> float:
    """Normalised latency (s per output token, mean over requests) with each request alone on the
    server: a prefill step of its prompt (which gives its first token), then one decode step of
    one sequence per further token, reading its prompt and the tokens so far. Each step is timed by
    ``step_model.predict``, so an overlapped model (the A100 roofline) takes the larger of each
    step's memory and compute times, a summed one their sum."""
    prompt = np.array([r.prompt_len for r in requests], dtype=np.int64)  # (requests,)
    output = np.array([r.output_len for r in requests], dtype=np.int64)  # (requests,)
    if prompt.size == 0:
        raise KVLibError("unloaded_latency needs at least one request")
    prefill = step_model.predict(1, 0, prompt)  # (requests,)
    # decode step k = 1 .. output - 1 of a request reads prompt + k tokens: one entry per decode step
    owner = np.repeat(np.arange(prompt.size), output - 1)  # (decode steps,)
    first = np.cumsum(output - 1) - (output - 1)  # where each request's decode steps start
    k = np.arange(owner.size) - first[owner] + 1
    decodes = np.bincount(
        owner, weights=step_model.predict(1, prompt[owner] + k, 0), minlength=prompt.size
    )  # (requests,)
    return float(np.mean((prefill + decodes) / output))


def saturated_runs(
    requests, num_slots: int, step_model: StepTimeModel, max_len: int, policies=POLICIES
) -> dict[str, RunResult]:
    """Each policy serving ``requests`` all queued at time 0 (a server that never idles)."""
    queued = [replace(r, arrival_s=0.0) for r in requests]
    return {p: simulate(queued, p, num_slots, step_model, max_len) for p in policies}


def capacities(requests, num_slots: int, step_model: StepTimeModel, max_len: int, policies=POLICIES) -> dict:
    """Each policy's saturated capacity (requests/s) on ``requests`` all queued at time 0."""
    runs = saturated_runs(requests, num_slots, step_model, max_len, policies)
    return {p: r.requests_per_s for p, r in runs.items()}


def batch_table(runs: dict[str, RunResult]) -> list[dict]:
    """Why paged sustains more: per saturated run, its mean batch and mean step while requests wait.

    Capacity is batch over step time (tokens per second, over the mean output), so paged's
    capacity over a policy's is, exactly, the ratio of their batches times the inverse ratio of
    their steps: a larger batch pays for its longer steps.
    """

    def step_s(run: RunResult) -> float:
        return run.mean_batch / run.tokens_per_s  # busy seconds per busy step

    paged = runs["paged"]
    return [
        {
            "policy": p,
            "mean batch": r.mean_batch,
            "step (ms)": 1e3 * step_s(r),
            "capacity (req/s)": r.requests_per_s,
            "paged's batch / its": paged.mean_batch / r.mean_batch,
            "its step / paged's": step_s(r) / step_s(paged),
            "paged's capacity / its": paged.requests_per_s / r.requests_per_s,
        }
        for p, r in runs.items()
    ]


def _row(spec: TraceSpec, run: RunResult, rate: float, capacity: float, unloaded: float) -> dict:
    summary = latency_summary(run)
    return {
        "trace": spec.name,
        "policy": run.policy,
        "rate": rate,
        "rate / capacity": rate / capacity,
        "s per token": summary.normalized_latency_s,
        "unloaded s per token": unloaded,
        "ttft p50 (s)": summary.ttft_p50_s,
        "ttft p99 (s)": summary.ttft_p99_s,
        "tpot p50 (s)": summary.tpot_p50_s,
        "tpot p99 (s)": summary.tpot_p99_s,
        "requests/s": len(run.finished) / run.makespan_s,
    }


def rate_sweep(
    spec: TraceSpec,
    num_requests: int,
    policies=POLICIES,
    step_model: StepTimeModel | None = None,
    num_slots: int | None = None,
    fractions=RATE_FRACTIONS,
    seed: int = 1,
    progress: bool = True,
) -> list[dict]:
    """Normalised latency, TTFT and TPOT (p50, p99) against request rate, per policy, on ``spec``.

    Defaults: the A100 OPT-13B roofline step and OPT-13B's budget on that GPU. Every rate serves
    the same seeded requests (the lengths do not depend on the rate; the Poisson gaps scale as 1 /
    rate). One row per (policy, rate); the rates of a policy are ``fractions`` of its capacity,
    extended upwards until the latency passes :data:`THRESHOLD_MULTIPLE` x unloaded (module doc).
    """
    step_model = roofline_step_model() if step_model is None else step_model
    num_slots = kv_budget().num_slots if num_slots is None else num_slots
    fractions = sorted(float(f) for f in fractions)
    if not fractions or fractions[0] <= 0 or not all(map(math.isfinite, fractions)):
        raise KVLibError(f"fractions of capacity must be finite and > 0, not {fractions!r}")
    queued = make_trace(spec, num_requests, math.inf, seed=seed)
    unloaded = unloaded_latency(queued, step_model)
    capacity = capacities(queued, num_slots, step_model, spec.max_len, policies)
    rows = []
    for policy in tqdm(policies, desc=f"{spec.name}: rate sweep", disable=not progress):
        rates = [f * capacity[policy] for f in fractions]
        for rate in rates:  # the loop sees the rates appended to the list while it runs
            requests = make_trace(spec, num_requests, rate, seed=seed)
            run = simulate(requests, policy, num_slots, step_model, spec.max_len)
            rows.append(_row(spec, run, rate, capacity[policy], unloaded))
            below = rows[-1]["s per token"] <= THRESHOLD_MULTIPLE * unloaded
            if rate == rates[-1] and below and len(rates) < len(fractions) + MAX_EXTENSIONS:
                rates.append(1.25 * rate)
    return rows


def crossing_rate(rates, latencies, threshold: float) -> float | None:
    """The rate at which latency first rises above ``threshold``, interpolated linearly in
    (log rate, log latency) between the last point at or below it and the first above it.

    ``None`` when no point is above (the grid ends before the knee) or the first one already is.
    """
    points = sorted(zip(rates, latencies, strict=True))
    for i, (rate, latency) in enumerate(points):
        if latency > threshold:
            if i == 0:
                return None
            (r0, l0), (r1, l1) = points[i - 1], (rate, latency)
            share = (math.log(threshold) - math.log(l0)) / (math.log(l1) - math.log(l0))
            return math.exp(math.log(r0) + share * (math.log(r1) - math.log(r0)))
    return None


@dataclass(frozen=True)
class SustainedRates:
    """The rule's outcome on one trace: its threshold and the rate each policy sustains under it."""

    trace: str  # the trace's name
    unloaded_s: float  # normalised latency with every request alone (s per output token)
    multiple: float  # the threshold over the unloaded latency
    rates: dict  # policy -> rate (requests/s) where its latency crosses the threshold (None: not on the grid)

    @property
    def threshold_s(self) -> float:
        """The latency threshold (s per output token), the same for every policy of the trace."""
        return self.multiple * self.unloaded_s


def sustained_rates(rows: list[dict], multiple: float = THRESHOLD_MULTIPLE) -> dict[str, SustainedRates]:
    """Per trace of :func:`rate_sweep`'s rows: the threshold and each policy's sustained rate."""
    if not (isinstance(multiple, int | float) and multiple > 1 and math.isfinite(multiple)):
        raise KVLibError(f"the threshold multiple must be a finite number > 1, not {multiple!r}")
    if not rows:
        raise KVLibError("no rows: run rate_sweep first")
    result = {}
    for trace in dict.fromkeys(r["trace"] for r in rows):
        mine = [r for r in rows if r["trace"] == trace]
        unloaded = mine[0]["unloaded s per token"]
        rates = {}
        for policy in dict.fromkeys(r["policy"] for r in mine):
            points = [(r["rate"], r["s per token"]) for r in mine if r["policy"] == policy]
            rates[policy] = crossing_rate(*zip(*points, strict=True), multiple * unloaded)
        result[trace] = SustainedRates(trace, unloaded, float(multiple), rates)
    return result


def rate_ratios(sustained: SustainedRates) -> dict[str, float]:
    """paged's sustained rate over each other policy's, on one trace."""
    missing = [p for p, r in sustained.rates.items() if r is None]
    if missing or "paged" not in sustained.rates:
        raise KVLibError(
            f"{sustained.trace}: no crossing of the threshold on the grid of {missing or ['paged']}: "
            "extend its rates"
        )
    paged = sustained.rates["paged"]
    return {p: paged / r for p, r in sustained.rates.items() if p != "paged"}


def comparison_table(sustained: dict[str, SustainedRates]) -> list[dict]:
    """Per trace: the threshold, each policy's sustained rate, paged's ratios and the paper's bands."""
    rows = []
    for trace, s in sustained.items():
        ratios, bands = rate_ratios(s), PAPER_RATE_BANDS.get(trace, {})
        rows.append(
            {
                "trace": trace,
                "threshold (s / token)": s.threshold_s,
                **{f"{p} (req/s)": r for p, r in s.rates.items()},
                **{f"paged / {p}": r for p, r in ratios.items()},
                **{f"paper: paged / {p}": f"{lo:g}-{hi:g}" for p, (lo, hi) in bands.items()},
            }
        )
    return rows


def latency_at_rate(
    spec: TraceSpec, num_requests: int, rate: float, policies=POLICIES, seed: int = 1
) -> dict[str, RunResult]:
    """Every policy serving the same seeded trace at one rate (A100 roofline step, OPT-13B's budget)."""
    requests = make_trace(spec, num_requests, rate, seed=seed)
    step_model, num_slots = roofline_step_model(), kv_budget().num_slots
    return {p: simulate(requests, p, num_slots, step_model, spec.max_len) for p in policies}


def bench() -> dict:
    """The paper's comparison for ``python -m kvlib bench`` (section "latency"): sustained-rate
    ratios on both traces, and p99 TTFT, TPOT and ITL per policy at the oracle's sustained rate on
    ShareGPT-like requests (about 20 s on one core). The three apart, as vLLM's benchmark reports
    them: TTFT per request, TPOT per request after its first token, ITL per gap between two tokens
    (over all gaps, so a few long stalls show in its p99 that a request's mean TPOT smooths out)."""
    rows = [row for spec, n in TRACE_SIZES for row in rate_sweep(spec, n, progress=False)]
    sustained = sustained_rates(rows)
    share, alpaca = rate_ratios(sustained[SHAREGPT.name]), rate_ratios(sustained[ALPACA.name])
    rate = sustained[SHAREGPT.name].rates["oracle"]
    summaries = {p: latency_summary(r) for p, r in latency_at_rate(SHAREGPT, TRACE_SIZES[0][1], rate).items()}
    return {
        "threshold_multiple": THRESHOLD_MULTIPLE,
        "sustained_rate_sharegpt": {p: round(r, 3) for p, r in sustained[SHAREGPT.name].rates.items()},
        "sustained_rate_alpaca": {p: round(r, 3) for p, r in sustained[ALPACA.name].rates.items()},
        "rate_ratio_paged_vs_oracle": round(share["oracle"], 3),
        "rate_ratio_paged_vs_max": round(share["max"], 3),
        "rate_ratio_paged_vs_oracle_alpaca": round(alpaca["oracle"], 3),
        "rate_ratio_paged_vs_max_alpaca": round(alpaca["max"], 3),
        "rate_for_latency_percentiles": round(rate, 3),
        "ttft_p99_s": {p: round(s.ttft_p99_s, 4) for p, s in summaries.items()},
        "tpot_p99_s": {p: round(s.tpot_p99_s, 4) for p, s in summaries.items()},
        "itl_p99_s": {p: round(s.itl_p99_s, 4) for p, s in summaries.items()},
    }
