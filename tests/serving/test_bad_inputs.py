"""A hostile round on kvlib.serving's public helpers (the simulator and engine constructors held):
each bad call is a one-line KVLibError naming the argument, or a right, finite answer.

Found in the round: StepTimeModel.predict took -1 and NaN counts (a step shorter than its fixed part,
a NaN time) and a string was a numpy UFuncTypeError; largest_batch_within of NaN or inf seconds was
ValueError or OverflowError, of -1 seconds 0; fixed_share took -1 sequences; SwapTimeModel.transfer_s
took -1 or NaN tokens and a string was a TypeError, step_s(None) a TypeError; HostPool(10**12) a
MemoryError; sample_lengths/make_trace of no TraceSpec an AttributeError, trace_stats([1]) too;
clipped_lognormal_mean of sigma 0 a ZeroDivisionError and of NaN, inf or low > high a NaN or a
wrong number; inter_token_latencies(None), solo_tokens(None, ...) and outputs_match_solo(m, None)
AttributeErrors; engine_clock("x") a RuntimeError."""

from __future__ import annotations

import math

import pytest

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.serving.engine import engine_clock, outputs_match_solo, run_engine, solo_tokens
from kvlib.serving.latency import goodput, inter_token_latencies, latency_summary
from kvlib.serving.scheduler import SchedulerConfig
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.swap import HostPool, SwapTimeModel
from kvlib.serving.traces import (
    SHAREGPT,
    Request,
    clipped_lognormal_mean,
    make_trace,
    sample_lengths,
    trace_stats,
)

NAN, INF = math.nan, math.inf
STEP = StepTimeModel(1e-3, 1e-4, 1e-7, 1e-6)
SWAP = SwapTimeModel(1024, 1e9)
REQUESTS = [Request(0, 0.0, (1, 2, 3), 4), Request(1, 0.01, (4, 5), 3)]
MODEL = TinyLlama(ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64))


def one_line(call, *words):
    with pytest.raises(KVLibError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and len(message) < 300 and all(w in message for w in words), message


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: STEP.predict(-1, 1, 1), ("num_seqs",)),
        (lambda: STEP.predict(NAN, 1, 1), ("num_seqs",)),
        (lambda: STEP.predict("a", 1, 1), ("num_seqs",)),
        (lambda: STEP.predict(1, [1, -5], 1), ("num_context_tokens",)),
        (lambda: STEP.predict(1, 1, INF), ("num_prefill_tokens",)),
        (lambda: STEP.largest_batch_within(-1, 100), ("seconds",)),
        (lambda: STEP.largest_batch_within(NAN, 100), ("seconds",)),
        (lambda: STEP.largest_batch_within(INF, 100), ("seconds",)),
        (lambda: STEP.largest_batch_within(1.0, -1), ("context_tokens_per_seq",)),
        (lambda: STEP.fixed_share(-1, 10), ("num_seqs",)),
        (lambda: STEP.fixed_share(1, float("nan")), ("num_context_tokens",)),
        (lambda: SWAP.transfer_s(-1), ("num_tokens",)),
        (lambda: SWAP.transfer_s(NAN), ("num_tokens",)),
        (lambda: SWAP.transfer_s("5"), ("num_tokens",)),
        (lambda: SWAP.step_s(None), ("swaps",)),
        (lambda: SWAP.step_s((-1,)), ("num_tokens",)),
        (lambda: HostPool(10**12, 4), ("num_blocks", "10,000,000")),
        (lambda: HostPool(NAN, 4), ("num_blocks",)),
        (lambda: HostPool(8, 4, "x"), ("cache",)),
    ],
)
def test_step_and_swap_models_name_bad_counts(call, words):
    one_line(call, *words)


def test_the_checked_models_still_answer():
    """1 sequence reading 100 tokens, no prefill: 1 ms + 0.1 ms + 100 x 0.1 us = 1.11 ms."""
    assert STEP.predict(1, 100, 0) == pytest.approx(1.11e-3)
    assert STEP.predict([1, 2], [100, 200], [0, 0]).shape == (2,)
    assert STEP.largest_batch_within(2e-3, 100) == 9  # (2 - 1) ms / 0.11 ms
    assert SWAP.transfer_s(1000) == pytest.approx(1024 * 1000 / 1e9)


SPEC = SHAREGPT


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: make_trace(None, 5, 1.0), ("spec", "TraceSpec")),
        (lambda: sample_lengths("chat", 5), ("spec", "TraceSpec")),
        (lambda: sample_lengths(SPEC, -1), ("number of requests",)),
        (lambda: sample_lengths(SPEC, NAN), ("number of requests",)),
        (lambda: sample_lengths(SPEC, 10**30), ("number of requests",)),
        (lambda: trace_stats([1]), ("Request",)),
        (lambda: trace_stats(None), ("Request",)),
        (lambda: trace_stats([]), ("empty",)),
        (lambda: clipped_lognormal_mean(1, 0, 1, 10), ("sigma",)),
        (lambda: clipped_lognormal_mean(1, -1, 1, 10), ("sigma",)),
        (lambda: clipped_lognormal_mean(NAN, 1, 1, 10), ("mu",)),
        (lambda: clipped_lognormal_mean(1, 1, 1, INF), ("high",)),
        (lambda: clipped_lognormal_mean(1, 1, 10, 1), ("low <= high",)),
        (lambda: clipped_lognormal_mean(1, 1, 0, 10), ("0 < low",)),
        (lambda: Request(0, NAN, (1,), 1), ("arrival_s",)),
        (lambda: Request(1.0, 0.0, (1,), 1), ("req_id",)),
        (lambda: SchedulerConfig(max_num_seqs=NAN), ("max_num_seqs",)),
        (lambda: SchedulerConfig(preemption_mode=None), ("preemption_mode",)),
    ],
)
def test_trace_helpers_name_their_bad_arguments(call, words):
    one_line(call, *words)


def test_the_clipped_mean_is_right_when_nothing_is_clipped():
    """low and high far outside the distribution: the log-normal's own mean, exp(mu + sigma^2 / 2)."""
    assert clipped_lognormal_mean(1.0, 0.5, 1e-9, 1e9) == pytest.approx(math.exp(1.0 + 0.125))


RUN = simulate(REQUESTS, "paged", 256, STEP, max_len=64)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: inter_token_latencies(None), ("RunResult",)),
        (lambda: latency_summary(None), ("RunResult",)),
        (lambda: goodput(RUN, NAN, 1.0), ("ttft",)),
        (lambda: goodput(RUN, -1, 1.0), ("ttft",)),
        (lambda: solo_tokens(None, REQUESTS[0]), ("TinyLlama", "NoneType")),
        (lambda: solo_tokens(MODEL, None), ("Request", "NoneType")),
        (lambda: outputs_match_solo(MODEL, None), ("RunResult",)),
        (lambda: engine_clock("x"), ("device", "'x'")),
        (lambda: simulate(None, "paged", 256, STEP), ("request",)),
        (lambda: simulate(REQUESTS, "x", 256, STEP), ("policy",)),
        (lambda: simulate(REQUESTS, "paged", 256, None), ("step_model",)),
        (lambda: simulate(REQUESTS, "paged", 256, STEP, watermark=NAN), ("watermark",)),
        (lambda: simulate(REQUESTS, "paged", 256, STEP, allocator="x"), ("allocator",)),
        (lambda: run_engine(None, REQUESTS, "paged", 4, 64, progress=False), ("model",)),
        (lambda: run_engine(MODEL, REQUESTS, "paged", 0, 64, progress=False), ("num_slots",)),
        (lambda: run_engine(MODEL, REQUESTS, "paged", 4, NAN, progress=False), ("max_len",)),
        (lambda: run_engine(MODEL, [Request(0, 0.0, (999,), 2)], "paged", 4, 64, progress=False), ("999",)),
    ],
)
def test_runs_and_their_results_name_bad_arguments(call, words):
    one_line(call, *words)


def test_the_checked_results_still_answer():
    gaps = inter_token_latencies(RUN)
    assert len(gaps) > 0 and bool((gaps > 0).all())
    assert goodput(RUN, INF, INF).num_good == len(REQUESTS)


def test_fixed_share_takes_average_counts():
    """Chapter 4 asks for the share at a run's average step (30.2 sequences): averages are real counts."""
    assert 0 < STEP.fixed_share(30.2, 15_000.5) < 1
