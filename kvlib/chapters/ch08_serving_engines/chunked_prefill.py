"""Chunked prefill's trade-off (chapter 8): the token budget per step against TTFT, TPOT and ITL; ``bench()``.

Without chunks a step that admits a long prompt computes all of it, and every running
request waits for that step: its next token comes late. Sarathi-Serve (Agrawal et al. 2024)
splits prompts into chunks that fit a budget of tokens per step beside the decodes (vLLM's
``--enable-chunked-prefill`` with ``--max-num-batched-tokens``; the scheduler's
:class:`~kvlib.serving.scheduler.SchedulerConfig`): a smaller budget bounds every step and
so the gaps between tokens, but a prompt takes more steps to finish, so its first token
comes later. :func:`chunked_prefill_sweep` simulates both on the A100 OPT-13B step model
(:func:`kvlib.serving.roofline.roofline_step_model`: a step takes the larger of its memory and
compute times, so a chunk rides free on a memory-bound decode step; ``overlapped=False`` adds
them, chapter 8's contrast) over a ShareGPT-like trace at one request rate: TTFT and TPOT at
p50 and p99 over requests (:func:`kvlib.serving.latency.latency_summary`), and the p99 of the
inter-token latency (ITL) over every gap between two tokens (:func:`inter_token_latencies`),
which vLLM's benchmark reports apart from TPOT: a request's TPOT is the mean of its gaps, so
one long step in a few hundred hardly moves it, while the ITL's p99 sees it. :func:`bench`
also checks that the real engine generates the same tokens with and without chunks.
"""

from __future__ import annotations

import math

from tqdm.auto import tqdm

from kvlib import KVLibError
from kvlib.checks import require_int, require_real
from kvlib.serving.latency import inter_token_latencies, latency_summary  # noqa: F401 (ITL, re-exported)
from kvlib.serving.results import RunResult
from kvlib.serving.roofline import kv_budget, roofline_step_model
from kvlib.serving.scheduler import SchedulerConfig
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import SHAREGPT, TraceSpec, make_trace

TOKEN_BUDGETS = (
    None,
    256,
    512,
    1024,
    2048,
)  # None: no chunking (chapter 4's scheduler); 512: vLLM V0's default

SWEEP_RATE = 3.0  # requests/s: the A100 model's paged server is busy but keeps up (it saturates near 4)


def chunked_config(budget: int | None, max_num_seqs: int = 256) -> SchedulerConfig:
    """The scheduler's config for one budget: ``None`` is chapter 4's (no chunks), an int the token budget."""
    if budget is None:
        return SchedulerConfig(max_num_seqs=max_num_seqs)
    return SchedulerConfig(
        max_num_seqs=max_num_seqs, enable_chunked_prefill=True, max_num_batched_tokens=budget
    )


def sweep_row(run: RunResult, budget: int | None) -> dict:
    """One row of :func:`chunked_prefill_sweep`: the run's latencies (seconds) under ``budget``."""
    summary = latency_summary(run)  # its ITL: kvlib.serving.latency.inter_token_latencies
    return {
        "budget": "off" if budget is None else budget,
        "ttft_p50_s": summary.ttft_p50_s,
        "ttft_p99_s": summary.ttft_p99_s,
        "tpot_p50_s": summary.tpot_p50_s,
        "tpot_p99_s": summary.tpot_p99_s,
        "itl_p99_s": summary.itl_p99_s,
        "max_step_s": float(run.steps["duration_s"].max()),
        "num_preemptions": run.num_preemptions,
    }


def chunked_prefill_sweep(
    budgets=TOKEN_BUDGETS,
    rate: float = SWEEP_RATE,
    num_requests: int = 500,
    spec: TraceSpec = SHAREGPT,
    seed: int = 0,
    step_model: StepTimeModel | None = None,
    num_slots: int | None = None,
    max_num_seqs: int = 256,
    progress: bool = True,
) -> list[dict]:
    """TTFT, TPOT and inter-token latency (p50/p99, seconds) for each token budget, one row each.

    The same ``num_requests`` requests of ``spec`` arrive at ``rate`` per second (Poisson,
    ``seed``) under the ``paged`` policy; ``step_model`` defaults to the A100 OPT-13B roofline (overlapped),
    ``num_slots`` to its KV budget (:func:`kvlib.serving.roofline.kv_budget`). A budget is
    ``None`` (no chunking) or an integer >= ``max_num_seqs`` (as vLLM requires).
    """
    rate = require_real(rate, "rate", positive=True)
    require_int(num_requests, "num_requests")
    budgets = list(budgets)
    if not budgets:
        raise KVLibError("chunked_prefill_sweep needs at least one budget")
    step_model = roofline_step_model() if step_model is None else step_model
    num_slots = kv_budget().num_slots if num_slots is None else num_slots
    configs = [chunked_config(b, max_num_seqs) for b in budgets]  # checks every budget first
    requests = make_trace(spec, num_requests, rate, seed=seed)
    rows = []
    for budget, config in tqdm(
        list(zip(budgets, configs, strict=True)), desc="budgets", disable=not progress
    ):
        run = simulate(requests, "paged", num_slots, step_model, spec.max_len, config=config)
        rows.append(sweep_row(run, budget))
    return rows


def tokens_identical_with_chunks(model=None, budget: int = 8, num_requests: int = 8) -> bool:
    """Does the real engine generate every request's tokens alike with and without chunked prefill?

    ``model`` defaults to chapter 4's engine model; the prompts (40 tokens on average) are longer
    than ``budget``, so each is prefilled over several steps, in a KV budget of 256 slots tight
    enough to preempt.
    """
    from kvlib.chapters.ch04_serving.policy_comparison import engine_model
    from kvlib.serving.engine import run_engine

    model = engine_model() if model is None else model
    spec = TraceSpec("chunked", 40, 12, sigma=0.5, max_len=128)
    requests = make_trace(spec, num_requests, math.inf, seed=1, vocab_size=model.config.vocab_size)
    runs = [
        run_engine(model, requests, "paged", 256, 128, config=chunked_config(b, 4), progress=False)
        for b in (None, budget)
    ]
    return [s.generated for s in runs[0].finished] == [s.generated for s in runs[1].finished]


def bench(budget: int = 512, rate: float = SWEEP_RATE) -> dict:
    """Chapter 8's chunked-prefill benchmarks (simulated): p99 latencies with ÷ without chunks under the
    summed A100 step model, the contrast (ShareGPT-like trace at ``rate``, token budget ``budget``); the
    same near saturation (4 requests/s, 256 tokens) under the book's overlapped step model (a step takes
    the larger of its memory and compute times, where chunks ride on memory-bound decodes, as
    Sarathi-Serve argues); and the real engine's tokens."""
    summed = roofline_step_model(overlapped=False)
    off, on = chunked_prefill_sweep((None, budget), rate=rate, step_model=summed, progress=False)
    busy_off, busy_on = chunked_prefill_sweep(
        (None, 256), rate=4.0, step_model=roofline_step_model(), progress=False
    )
    return {
        "chunked_prefill_tpot_p99_ratio": round(on["tpot_p99_s"] / off["tpot_p99_s"], 4),
        "chunked_prefill_ttft_p99_ratio": round(on["ttft_p99_s"] / off["ttft_p99_s"], 4),
        "chunked_prefill_itl_p99_ratio": round(on["itl_p99_s"] / off["itl_p99_s"], 4),
        "chunked_prefill_itl_p99_ratio_overlapped": round(busy_on["itl_p99_s"] / busy_off["itl_p99_s"], 4),
        "chunked_prefill_ttft_p99_ratio_overlapped": round(busy_on["ttft_p99_s"] / busy_off["ttft_p99_s"], 4),
        "chunked_prefill_tokens_identical": tokens_identical_with_chunks(),
    }
