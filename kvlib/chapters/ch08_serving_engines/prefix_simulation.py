"""Prefix caching simulated (chapter 8, "Serving as engines do it now"): the simulator with the cache off
and on, beside :mod:`kvlib.chapters.ch08_serving_engines.prefix_prediction`'s prediction. (The module keeps
its older name; what it
reports is simulated, timed by a step model, not measured on a machine.)

:func:`shared_prefix_trace` puts a shared part in front of every prompt of a saturated
ShareGPT-like trace (one system prompt, or one of several tenants' prefixes);
:func:`simulated_gain` serves it with the paged policy, caching off then on, on the A100 OPT-13B
step model and budget (chapter 4: a step takes the larger of its memory and compute times);
:func:`gain_table` sets prediction and simulation side by side over shared lengths and output
lengths, :func:`eviction_table` under load with many prefixes, where the cache evicts them and
the simulated gain falls (why users report "no gain": see
:mod:`kvlib.chapters.ch08_serving_engines.prefix_prediction`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.prefix_prediction import (
    PrefixGain,
    predict_trace,
    predicted_gain,
    step_model_and_budget,
)
from kvlib.checks import require_int, require_real
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import SHAREGPT, Request, TraceSpec, make_trace

# A ShareGPT-like trace with room for a long system prompt in front of each prompt (tokens).
LONG_CONTEXT = 4096

# Throughput is counted while requests wait (RunResult.tokens_per_s); a run must spend at least this
# share of its time so, or the few steps before the queue empties (prefill-heavy) would be all it counts.
MIN_SATURATED_SHARE = 0.25

# Token ids of the shared prefixes start here, above the random prompts' ids (vocab_size 512).
PREFIX_TOKEN_BASE = 1000


def shared_prefix_trace(
    num_requests: int,
    shared_len: int,
    spec: TraceSpec = SHAREGPT,
    num_prefixes: int = 1,
    seed: int = 0,
) -> list[Request]:
    """A saturated trace (every request at time 0) whose prompts start with a shared part of
    ``shared_len`` tokens: one system prompt (:func:`~kvlib.serving.traces.make_trace`'s
    ``system_prompt``), or each request one of ``num_prefixes`` (tenants, drawn with the seed).

    ``spec``'s maximum length is raised to :data:`LONG_CONTEXT` so that a long system prompt
    leaves room for the trace's own prompts; outputs are cut to fit, as make_trace does.
    """
    shared_len, num_prefixes = (
        require_int(shared_len, "shared_len", 0),
        require_int(num_prefixes, "num_prefixes"),
    )
    if not isinstance(spec, TraceSpec):
        raise KVLibError(f"spec must be a TraceSpec, not {type(spec).__name__}")
    spec = TraceSpec(
        spec.name, spec.mean_input, spec.mean_output, spec.sigma, max(spec.max_len, LONG_CONTEXT)
    )
    prefixes = [
        tuple(range(PREFIX_TOKEN_BASE + k * shared_len, PREFIX_TOKEN_BASE + (k + 1) * shared_len))
        for k in range(num_prefixes)
    ]
    if num_prefixes == 1:
        return make_trace(spec, num_requests, float("inf"), seed=seed, system_prompt=prefixes[0])
    plain = make_trace(spec, num_requests, float("inf"), seed=seed)
    tenants = np.random.default_rng([seed, 2]).integers(0, num_prefixes, len(plain))  # (requests,)
    requests = []
    for r, k in zip(plain, tenants, strict=True):
        prompt = prefixes[k] + r.prompt
        if len(prompt) >= spec.max_len:
            raise KVLibError(f"a shared part of {shared_len} tokens leaves no room within {spec.max_len}")
        requests.append(Request(r.req_id, r.arrival_s, prompt, min(r.output_len, spec.max_len - len(prompt))))
    return requests


@dataclass(frozen=True)
class SimulatedGain:
    """One trace simulated with prefix caching off and on (the paged policy)."""

    throughput_ratio: float  # output tokens per second while requests wait, on over off
    # 1 - prompt tokens computed on / off, recomputation after preemption included: it may exceed the
    # cached share of the prompts, since a preempted request recomputed later finds its own blocks cached
    prefill_saved_share: float
    batch_without: float  # mean sequences per step while requests wait, caching off
    batch_with: float  # the same, caching on
    num_preemptions_without: int  # preemptions (by recomputation), caching off
    num_preemptions_with: int  # the same, caching on


def simulated_gain(
    requests: list[Request],
    num_slots: int | None = None,
    step_model: StepTimeModel | None = None,
    block_size: int = 16,
) -> SimulatedGain:
    """:func:`~kvlib.serving.simulator.simulate` of ``requests`` (paged) with caching off, then on.

    A trace that keeps the server saturated for under :data:`MIN_SATURATED_SHARE` of either run
    is refused: with caching on, a few dozen requests may all fit at once, and the throughput
    while requests wait would then be that of the first, prefill-heavy steps only.
    """
    step_model, num_slots = step_model_and_budget(step_model, num_slots)
    off, on = (
        simulate(
            requests,
            "paged",
            num_slots,
            step_model,
            max_len=max(r.total_len for r in requests),
            block_size=block_size,
            enable_prefix_caching=caching,
        )
        for caching in (False, True)
    )
    for run in (off, on):
        busy = run.steps["num_waiting"] > 0
        if run.steps["duration_s"][busy].sum() < MIN_SATURATED_SHARE * run.steps["duration_s"].sum():
            raise KVLibError(
                f"{len(requests)} requests keep the server saturated for too short a time to measure a "
                f"throughput (caching {'on' if run is on else 'off'}): pass more requests"
            )
    return SimulatedGain(
        throughput_ratio=on.tokens_per_s / off.tokens_per_s,
        prefill_saved_share=1 - float(on.steps["prefill_tokens"].sum() / off.steps["prefill_tokens"].sum()),
        batch_without=off.mean_batch,
        batch_with=on.mean_batch,
        num_preemptions_without=off.num_preemptions,
        num_preemptions_with=on.num_preemptions,
    )


def _row(label: dict, predicted: PrefixGain, simulated: SimulatedGain) -> dict:
    return {
        **label,
        "cached share of the prompt (%)": 100 * predicted.shared_fraction,
        "predicted: compute saved at equal batch (%)": 100 * predicted.prefill_share_saved,
        "predicted: KV memory saved (%)": 100 * predicted.memory_saved_share,
        "predicted: batch off -> on": f"{predicted.batch_without:.1f} -> {predicted.batch_with:.1f}",
        "simulated: batch off -> on": f"{simulated.batch_without:.1f} -> {simulated.batch_with:.1f}",
        "predicted: throughput on / off": predicted.throughput_ratio,
        "simulated: throughput on / off": simulated.throughput_ratio,
        "simulated: prefill tokens saved (%)": 100 * simulated.prefill_saved_share,
    }


def gain_table(
    shared_lens=(16, 256, 1024),
    mean_outputs=(SHAREGPT.mean_output, 16.0),
    num_requests: int = 96,
    num_slots: int | None = None,
    step_model: StepTimeModel | None = None,
) -> list[dict]:
    """Predicted against simulated, one row per shared length and mean output length (ShareGPT-like
    prompts, a saturated server, the A100 OPT-13B model and budget by default; chapter 8)."""
    step_model, num_slots = step_model_and_budget(step_model, num_slots)
    rows = []
    for mean_output in mean_outputs:
        require_real(mean_output, "mean output length", positive=True)
        spec = TraceSpec(f"ShareGPT-like prompts, outputs {mean_output:g}", SHAREGPT.mean_input, mean_output)
        for shared_len in shared_lens:
            requests = shared_prefix_trace(num_requests, shared_len, spec)
            predicted = predict_trace(requests, shared_len, step_model, num_slots)
            label = {"shared tokens": shared_len, "mean output": predicted.mean_output_len}
            rows.append(_row(label, predicted, simulated_gain(requests, num_slots, step_model)))
    return rows


def eviction_table(
    shared_len: int = 256,
    num_prefixes=(1, 16),
    budgets=None,
    num_requests: int = 96,
    step_model: StepTimeModel | None = None,
) -> list[dict]:
    """The gain when the cache must hold ``num_prefixes`` distinct shared parts (tenants), in a
    budget under load (default: a third of the A100's). Where the prefixes in use do not fit
    beside the running requests, a prefix is evicted between two of its requests and computed
    again: the simulated prefill saving falls below the cached share that the prediction assumes
    (every shared block a hit), and the gain falls with it (chapter 8). The prediction stores all
    ``num_prefixes`` once, or, when they do not fit, shares no memory and keeps the compute half."""
    step_model, full = step_model_and_budget(step_model, None)
    rows = []
    for num_slots in (full // 3,) if budgets is None else budgets:
        for count in num_prefixes:
            requests = shared_prefix_trace(num_requests, shared_len, num_prefixes=count)
            predicted = predict_trace(requests, shared_len, step_model, num_slots, num_prefixes=count)
            label = {"KV slots": num_slots, "distinct prefixes": count, "prefix slots": count * shared_len}
            rows.append(_row(label, predicted, simulated_gain(requests, num_slots, step_model)))
    return rows


def bench() -> dict:
    """Prefix caching's benchmarks for ``python -m kvlib bench`` (chapter 8): ShareGPT-like requests
    behind a 1,024-token system prompt, predicted and simulated, and under eviction (the keys keep their
    older names: ``measured`` there means simulated)."""
    predicted = predicted_gain(0.5, 2 * 161, 338)
    requests = shared_prefix_trace(96, 1024)
    simulated = simulated_gain(requests)
    evicted = eviction_table(num_prefixes=(16,))[0]
    return {
        "prefix_predicted_compute_saved_half_shared": round(predicted.prefill_share_saved, 4),
        "prefix_predicted_throughput_ratio_1024": round(predict_trace(requests, 1024).throughput_ratio, 3),
        "prefix_measured_throughput_ratio_1024": round(simulated.throughput_ratio, 3),
        "prefix_measured_throughput_ratio_evicted": round(evicted["simulated: throughput on / off"], 3),
    }
