"""Chapter 4's experiments: the four placement policies on one trace, their memory and
throughput, step-time regimes, the watermark, the engine's small model, and ``bench()`` for
``python -m kvlib bench``. The comparison at equal latency is
:mod:`kvlib.chapters.ch04_serving.rate_comparison`.

The vLLM paper serves OPT-13B on one NVIDIA A100 with 40 GB (Kwon et al. 2023). Our
simulations (:func:`kvlib.serving.simulator.simulate`) use the KV budget that setup
leaves (:func:`kvlib.serving.roofline.kv_budget`), the lengths of its traces
(:mod:`kvlib.serving.traces`), and a step-time model fitted to steps measured on this machine
(:func:`kvlib.serving.calibration.calibrate`: a sum of its parts, as a CPU runs them) or
modelled from the A100's data sheet (:func:`kvlib.serving.roofline.roofline_step_model`: the
larger of a step's memory and compute times, as a GPU overlaps them), so that both regimes can
be set side by side. The ``PAPER_*`` constants are the paper's figures the chapter shows beside
its own (never as pass marks).
"""

from __future__ import annotations

import math

import numpy as np
from tqdm.auto import tqdm

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.lean import LeanLlama
from kvlib.serving.placement import POLICIES
from kvlib.serving.results import RunResult
from kvlib.serving.roofline import kv_budget, roofline_step_model
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import SHAREGPT, make_trace
from kvlib.serving.types import CATEGORIES

# The vLLM paper's figures (Kwon et al. 2023; OPT-13B on an A100, ShareGPT unless stated).
PAPER_TOKEN_SHARE = {"max": 0.204, "pow2": 0.268, "oracle": 0.382, "paged": 0.963}  # Figure 2

PAPER_RATE_VS_ORACLE = (1.7, 2.7)  # request rate sustained at similar latency, vLLM / Orca-Oracle (ShareGPT)

PAPER_RATE_VS_MAX = (2.7, 8.0)  # vLLM / Orca-Max (ShareGPT)

PAPER_SAVING_PARALLEL = (0.061, 0.098)  # KV memory saved by sharing, parallel sampling n = 2..6 (Alpaca)

PAPER_SAVING_BEAM = (0.376, 0.552)  # beam search, width 2..6 (Alpaca)

ONE_PER_STEP = StepTimeModel(
    1.0, 0.0, 0.0, 0.0, source="one time unit per step"
)  # for runs whose clock does not matter


def paper_band(ratio: float, band: tuple[float, float], ja: bool = False) -> str:
    """Where a ratio of ours lies against one of the paper's bands (:data:`PAPER_RATE_VS_ORACLE`,
    :data:`PAPER_RATE_VS_MAX`), in words for the prose: inside, below or above (in Japanese if ``ja``)."""
    low, high = band
    where = "inside" if low <= ratio <= high else ("below" if ratio < low else "above")
    if ja:
        return {"inside": "論文の範囲内", "below": "論文の範囲より下", "above": "論文の範囲より上"}[where]
    return f"{where} the paper's band"


def serve_policies(
    requests,
    num_slots: int,
    step_model: StepTimeModel,
    max_len: int,
    policies=POLICIES,
    progress: bool = True,
    **kwargs,
) -> dict[str, RunResult]:
    """Simulate the same requests under each policy and one budget."""
    return {
        policy: simulate(requests, policy, num_slots, step_model, max_len, **kwargs)
        for policy in tqdm(policies, desc="simulating", disable=not progress)
    }


def memory_table(runs: dict[str, RunResult]) -> list[dict]:
    """Per policy: the budget's time-averaged share in each category (%) while requests wait, and
    the batch."""
    rows = []
    for policy, run in runs.items():
        shares = run.memory_shares()
        rows.append(
            {
                "policy": policy,
                **{f"{c} (%)": 100 * shares[c] for c in CATEGORIES},
                "paper: tokens (%)": 100 * PAPER_TOKEN_SHARE[policy],
                "mean batch": run.mean_batch,
                "largest batch": run.largest_batch,
                "preemptions": run.num_preemptions,
            }
        )
    return rows


def operating_point(run: RunResult) -> tuple[float, float]:
    """Sequences and context tokens of the average step while requests wait."""
    busy = run.steps["num_waiting"] > 0
    return float(run.steps["num_seqs"][busy].mean()), float(run.steps["context_tokens"][busy].mean())


def fixed_share(run: RunResult, step_model: StepTimeModel) -> float:
    """Share of an average decode step of ``run`` that does not grow with the batch."""
    return step_model.fixed_share(*operating_point(run))


def with_fixed_share(
    step_model: StepTimeModel, share: float, num_seqs: float, context_tokens: float
) -> StepTimeModel:
    """The step model with its per-sequence and per-context-token costs scaled so that a decode
    step of ``num_seqs`` sequences reading ``context_tokens`` spends ``share`` of its time on the
    fixed part. Prefill keeps its measured cost. ``share = 1``: decode steps cost the same
    whatever the batch. ``step_model`` must be a summed one (a CPU's, fitted by the calibration):
    an overlapped step's share is not a matter of scaling its terms."""
    if not 0 < share <= 1:
        raise KVLibError(f"the fixed share must be in (0, 1], not {share}")
    if step_model.overlapped or step_model.per_seq_memory_s:
        raise KVLibError("with_fixed_share scales a summed step model (fixed + per sequence + per token)")
    variable = step_model.per_seq_s * num_seqs + step_model.per_context_s * context_tokens
    scale = 0.0 if share == 1 else step_model.fixed_s * (1 - share) / share / variable
    return StepTimeModel(
        step_model.fixed_s,
        step_model.per_seq_s * scale,
        step_model.per_context_s * scale,
        step_model.per_prefill_s,
        source=f"fixed share {share:.2f}",
    )


def ratios(runs: dict[str, RunResult], step_model: StepTimeModel | None = None) -> dict[str, float]:
    """Throughput of ``paged`` over each reservation policy (requests/s while requests wait),
    optionally retimed by another step model (the runs must have had every request at time 0)."""
    timed = runs if step_model is None else {p: r.retimed(step_model) for p, r in runs.items()}
    paged = timed["paged"].requests_per_s
    return {p: paged / r.requests_per_s for p, r in timed.items() if p != "paged"}


def busy_totals(run: RunResult) -> dict[str, float]:
    """What the steps of ``run`` compute while requests wait (the steps that set its throughput):
    how many steps, and the sums of their sequences, context tokens read, prompt tokens prefilled
    and tokens generated. A summed step model times those steps at
    ``fixed_s x steps + per_seq_s x seqs + per_context_s x context + per_prefill_s x prefill``."""
    busy = run.steps["num_waiting"] > 0
    busy = busy if busy.any() else np.ones_like(busy)
    totals = {"steps": float(busy.sum())}
    for name, key in (
        ("seqs", "num_seqs"),
        ("context", "context_tokens"),
        ("prefill", "prefill_tokens"),
        ("tokens", "new_tokens"),
    ):
        totals[name] = float(run.steps[key][busy].sum())
    return totals


def prefill_limit(runs: dict[str, RunResult], policy: str) -> float:
    """The cost of a prompt token, as a share of a step's fixed part, below which ``paged`` serves more
    requests per second than ``policy`` under every summed step model, whatever it costs per
    sequence and per cached token (``inf``: at any cost).

    With g = paged, p = ``policy`` and tau = g's tokens over p's (both over :func:`busy_totals`),
    paged / p = tau x T_p / T_g, each T the step model's sum over the busy steps; it exceeds 1 when
    ``fixed_s (tau S_p - S_g) + per_seq_s (tau N_p - N_g) + per_context_s (tau C_p - C_g)``
    outweighs ``per_prefill_s (P_g - tau P_p)``. When the sequence and context terms are not
    negative, they can only help, and the bound on per_prefill_s / fixed_s is
    ``(tau S_p - S_g) / (P_g - tau P_p)``. Raises KVLibError when a term is negative (the
    bound would then depend on those costs too), or when paged needs as many steps.
    """
    g, p = busy_totals(runs["paged"]), busy_totals(runs[policy])
    tau = g["tokens"] / p["tokens"]
    fixed, per_seq, per_context = (tau * p[k] - g[k] for k in ("steps", "seqs", "context"))
    # each sequence computes one token (no chunked prefill here), so tau N_p = N_g up to rounding
    if fixed <= 0 or per_seq < -1e-9 * g["seqs"] or per_context < 0:
        raise KVLibError(
            f"paged against {policy}: the steps, sequences or context tokens do not all favour paged "
            f"({fixed:.3g}, {per_seq:.3g}, {per_context:.3g}): no bound on the prompt cost alone"
        )
    extra_prefill = g["prefill"] - tau * p["prefill"]
    return math.inf if extra_prefill <= 0 else fixed / extra_prefill


def regime_curve(runs: dict[str, RunResult], step_model: StepTimeModel, shares) -> list[dict]:
    """Throughput ratios paged / each policy when a decode step's fixed share (at paged's
    operating point) is each of ``shares``: how much of paging's larger batch becomes throughput."""
    point = operating_point(runs["paged"])
    return [
        {
            "fixed share": s,
            **{f"paged / {p}": r for p, r in ratios(runs, with_fixed_share(step_model, s, *point)).items()},
        }
        for s in shares
    ]


def share_needed(curve: list[dict], policy: str, ratio: float) -> float | None:
    """Smallest fixed share of a decode step at which paged's throughput reaches ``ratio`` times
    ``policy``'s on a :func:`regime_curve` (interpolated between its points); ``None`` if it never does."""
    points = [(row["fixed share"], row[f"paged / {policy}"]) for row in curve]
    for (s0, r0), (s1, r1) in zip(points, points[1:], strict=False):  # each point and the next
        if r0 >= ratio:
            return s0
        if r1 >= ratio:
            return s0 + (s1 - s0) * (ratio - r0) / (r1 - r0)
    return None if points[-1][1] < ratio else points[-1][0]


def watermark_sweep(
    requests,
    num_slots: int,
    max_len: int,
    watermarks,
    runs: dict[str, RunResult],
    step_model: StepTimeModel,
    progress: bool = True,
) -> list[dict]:
    """``paged`` with several admission watermarks (the share of blocks kept free when a request
    is admitted), every request queued at time 0: preemptions, the prompt tokens prefilled
    (recomputation included) per prompt token, memory use, and throughput over the
    reservation policies of ``runs`` when timed by ``step_model``."""
    prompt_tokens = sum(r.prompt_len for r in requests)
    rows = []
    for watermark in tqdm(watermarks, desc="watermarks", disable=not progress):
        run = simulate(requests, "paged", num_slots, ONE_PER_STEP, max_len, watermark=watermark)
        rows.append(
            {
                "watermark (%)": 100 * watermark,
                "preemptions": run.num_preemptions,
                "prefilled / prompt tokens": float(run.steps["prefill_tokens"].sum()) / prompt_tokens,
                "tokens (%)": 100 * run.utilisation,
                "mean batch": run.mean_batch,
                **{f"paged / {p}": r for p, r in ratios({**runs, "paged": run}, step_model).items()},
            }
        )
    return rows


def preemption_costs(run: RunResult, requests) -> dict:
    """What the preemptions of a run (all ``requests``, no prefix caching) cost in recomputation:
    how many tokens each preempted request had generated (quartiles, and the share that had
    generated at most 50), and, of all tokens prefilled again, the share that were generated
    ones rather than prompts (chapter 4: why a larger watermark gains little)."""
    generated = run.preempted_generated
    if len(generated) == 0:
        raise KVLibError(f"the {run.policy} run has no preemptions to look at")
    recomputed = float(run.steps["prefill_tokens"].sum()) - sum(r.prompt_len for r in requests)
    q25, q50, q75 = (float(q) for q in np.percentile(generated, [25, 50, 75]))
    return {
        "preemptions": len(generated),
        "generated before preemption: 25%": q25,
        "median": q50,
        "75%": q75,
        "largest": int(generated.max()),
        "share with <= 50 generated": float(np.mean(generated <= 50)),
        "tokens recomputed": int(recomputed),
        "generated share of the recomputed": float(generated.sum()) / recomputed,
    }


def cap_table(runs: dict[str, RunResult], max_num_seqs: int = 256) -> list[dict]:
    """Per saturated paged run (one per trace): its batch, and how often the scheduler's cap on running
    requests, not memory, is what stops admission (:meth:`RunResult.at_cap`)."""
    rows = []
    for trace, run in runs.items():
        share, free_at_cap, free_else = run.at_cap(max_num_seqs)
        rows.append(
            {
                "trace": trace,
                "mean batch": run.mean_batch,
                "largest batch": run.largest_batch,
                f"steps at the cap of {max_num_seqs} (%)": 100 * share,
                "budget free at the cap (%)": 100 * free_at_cap,
                "budget free below the cap (%)": 100 * free_else,
            }
        )
    return rows


ENGINE_CONFIG = ModelConfig(
    vocab_size=512, d_model=64, num_layers=4, num_heads=4, num_kv_heads=1, d_ff=172, max_seq_len=1024
)


def engine_model(device=None) -> LeanLlama:
    """The small model chapter 4 serves and calibrates with: 4 layers, width 64, one K/V head (MQA);
    lean (:class:`~kvlib.model.lean.LeanLlama`), as the timed engine steps want it."""
    return LeanLlama(ENGINE_CONFIG).to(device).eval()


def bench(num_requests: int = 1000) -> dict:
    """Benchmarks of chapter 4 for ``python -m kvlib bench``."""
    from kvlib.measure.timing import pick_device
    from kvlib.serving.calibration import calibrate
    from kvlib.serving.engine import race_engine

    device = pick_device()
    model = engine_model(device)
    step_model = calibrate(model, progress=False).model
    budget = kv_budget()
    requests = make_trace(SHAREGPT, num_requests, math.inf, seed=0)
    runs = serve_policies(requests, budget.num_slots, step_model, SHAREGPT.max_len, progress=False)
    measured, roofline = ratios(runs), ratios(runs, roofline_step_model())
    scaled = SHAREGPT.scaled(8)
    small = make_trace(scaled, 150, math.inf, seed=0, vocab_size=ENGINE_CONFIG.vocab_size)
    real = race_engine(model, small, ("max", "paged"), 8 * scaled.max_len, scaled.max_len, progress=False)
    return {
        "kv_utilization": {p: round(r.utilisation, 4) for p, r in runs.items()},
        "batch_ratio_paged_vs_oracle": round(runs["paged"].mean_batch / runs["oracle"].mean_batch, 3),
        "batch_ratio_paged_vs_max": round(runs["paged"].mean_batch / runs["max"].mean_batch, 3),
        "throughput_ratio_paged_vs_oracle": round(measured["oracle"], 3),
        "throughput_ratio_paged_vs_max": round(measured["max"], 3),
        "throughput_ratio_paged_vs_oracle_a100_roofline": round(roofline["oracle"], 3),
        "throughput_ratio_paged_vs_max_a100_roofline": round(roofline["max"], 3),
        "decode_fixed_share": round(fixed_share(runs["paged"], step_model), 3),
        "real_engine_throughput_ratio_paged_vs_max": round(
            real["max"].makespan_s / real["paged"].makespan_s, 3
        ),
    }
