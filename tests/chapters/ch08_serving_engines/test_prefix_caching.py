"""Prefix caching predicted and simulated (kvlib.chapters.ch08_serving_engines.prefix_prediction and
prefix_measured, chapter 8): hits
by hand, the compute and memory halves of the gain by hand, and the simulator's result beside them."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.prefix_prediction import (
    admissions_per_step,
    predict_trace,
    predicted_gain,
    prefix_hit_tokens,
)
from kvlib.chapters.ch08_serving_engines.prefix_simulation import (
    eviction_table,
    gain_table,
    shared_prefix_trace,
    simulated_gain,
)
from kvlib.serving.roofline import roofline_step_model
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import SHAREGPT, TraceSpec, make_trace

BIG = 10**9  # slots: memory never limits the batch


def test_only_whole_blocks_of_the_shared_part_are_hits_and_the_last_token_is_computed():
    assert prefix_hit_tokens(100, 500) == 96  # 6 whole blocks of 16
    assert prefix_hit_tokens(15, 500) == 0  # under one block: nothing cached
    assert prefix_hit_tokens(64, 64) == 48  # a fully shared prompt: (64 - 1) // 16 = 3 blocks
    assert prefix_hit_tokens(64, 65) == 64
    assert prefix_hit_tokens(100, 500, block_size=32) == 96  # 3 blocks of 32


def test_prompts_are_packed_into_steps_of_max_prefill_tokens():
    assert admissions_per_step([1000, 1000, 1000]) == 1.5  # [1000, 1000] then [1000]
    assert admissions_per_step([3000, 10]) == 1.0  # the first prompt of a step always fits
    assert admissions_per_step([100] * 40, max_prefill_tokens=1000) == 10.0


def test_the_compute_half_saves_the_cached_prefill_only():
    prefill_only = StepTimeModel(0.0, 0.0, 0.0, 1.0)
    gain = predicted_gain(0.5, 320, 160, prefill_only, num_slots=BIG)
    assert gain.mean_cached_len == 160  # 10 whole blocks
    assert gain.prefill_share_saved == pytest.approx(0.5)
    # one second per output token as well: 160 + 320 without, 160 + 160 with
    with_decode = StepTimeModel(0.0, 1.0, 0.0, 1.0)
    assert predicted_gain(0.5, 320, 160, with_decode, num_slots=BIG).prefill_share_saved == pytest.approx(
        1 - 320 / 480
    )


def test_an_overlapped_step_model_saves_compute_only_where_a_step_is_bound_by_it():
    # 1 s of memory per step; 256 prompts of 320 tokens, 160 outputs each: 160 steps of 256 decodes, the
    # prompts spread over all of them (96 steps prefill two, 64 steps one)
    cheap = StepTimeModel(1.0, 0.0, 0.0, 1e-3, overlapped=True)  # two prompts compute 0.64 s: under 1 s
    assert predicted_gain(0.5, 320, 160, cheap, num_slots=BIG).prefill_share_saved == 0.0
    dear = StepTimeModel(1.0, 0.0, 0.0, 1e-2, overlapped=True)  # one prompt computes 3.2 s: over 1 s
    without = 96 * 6.4 + 64 * 3.2  # every step bound by its compute
    with_cache = 96 * 3.2 + 64 * 1.6  # 160 of each prompt's 320 tokens cached: still over 1 s
    gain = predicted_gain(0.5, 320, 160, dear, num_slots=BIG)
    assert gain.prefill_share_saved == pytest.approx(1 - with_cache / without)


def test_the_memory_half_grows_the_batch_by_the_shared_blocks():
    fixed_only = StepTimeModel(1.0, 0.0, 0.0, 0.0)  # time = steps = outputs / batch
    gain = predicted_gain(0.5, 1000, 100, fixed_only, num_slots=10_000)
    cached = 31 * 16  # 500 shared tokens: 31 whole blocks
    held_without = 1000 + (100 + 1) / 2 + 16 / 2  # prompt, half the output, half a block
    held_with = held_without - cached
    batch_without, batch_with = 10_000 / held_without, (10_000 - cached) / held_with
    assert gain.batch_without == pytest.approx(batch_without)
    assert gain.batch_with == pytest.approx(batch_with)
    assert gain.throughput_ratio == pytest.approx(batch_with / batch_without)
    assert gain.memory_saved_share == pytest.approx(1 - 10_000 / (batch_with * held_without))
    assert gain.prefill_share_saved == 0.0  # this step model charges nothing for prefill


def test_a_shared_part_under_one_block_gains_nothing():
    gain = predicted_gain(0.01, 1000, 300)  # 10 tokens
    assert gain.mean_cached_len == 0 and gain.prefill_share_saved == 0 and gain.throughput_ratio == 1


@settings(max_examples=15, deadline=None)
@given(st.floats(0.1, 1.0), st.integers(64, 1500), st.integers(1, 500))
def test_longer_outputs_dilute_the_compute_half(fraction, prompt_len, output_len):
    model = roofline_step_model()
    short, long = (predicted_gain(fraction, prompt_len, n, model) for n in (output_len, 2 * output_len + 10))
    assert long.prefill_share_saved <= short.prefill_share_saved
    assert 0 <= long.prefill_share_saved < 1


def test_the_trace_has_its_shared_parts_in_front():
    requests = shared_prefix_trace(8, 32)
    spec = TraceSpec(SHAREGPT.name, SHAREGPT.mean_input, SHAREGPT.mean_output, max_len=4096)
    plain = make_trace(spec, 8, float("inf"), system_prompt=tuple(range(1000, 1032)))
    assert [r.prompt[32:] for r in requests] == [r.prompt[32:] for r in plain]
    assert all(r.prompt[:32] == tuple(range(1000, 1032)) for r in requests)
    tenants = shared_prefix_trace(30, 32, num_prefixes=4)
    assert len({r.prompt[:32] for r in tenants}) == 4
    assert all(r.total_len <= 4096 for r in tenants)


def test_the_simulator_measures_a_gain_where_the_prediction_expects_one():
    requests = shared_prefix_trace(96, 256)
    simulated, predicted = simulated_gain(requests), predict_trace(requests, 256)
    assert simulated.prefill_saved_share > 0.4 and predicted.shared_fraction > 0.5
    assert simulated.throughput_ratio > 1.2 and predicted.throughput_ratio > 1.2
    assert simulated.batch_with > 1.3 * simulated.batch_without


def test_short_outputs_gain_more_than_long_ones_in_the_table():
    (short,) = gain_table(shared_lens=(256,), mean_outputs=(16.0,))
    long = predict_trace(shared_prefix_trace(96, 256), 256)
    assert short["predicted: compute saved at equal batch (%)"] > 5 * 100 * long.prefill_share_saved
    assert short["simulated: throughput on / off"] > 1.3 and short["shared tokens"] == 256


def test_too_few_requests_to_saturate_are_refused():
    with pytest.raises(KVLibError, match="saturated"):
        simulated_gain(shared_prefix_trace(24, 512))  # with caching on all 24 fit at once


@pytest.mark.slow
def test_evicted_prefixes_lose_the_gain():
    one, many = eviction_table()  # 1 and 16 prefixes of 256 tokens in a third of the A100's budget
    assert many["simulated: prefill tokens saved (%)"] < one["simulated: prefill tokens saved (%)"] - 10
    assert many["simulated: throughput on / off"] < one["simulated: throughput on / off"] - 0.2
    assert many["cached share of the prompt (%)"] == one["cached share of the prompt (%)"]


@pytest.mark.parametrize(
    "call",
    [
        lambda: predicted_gain(1.5, 100, 10),
        lambda: predicted_gain(0.5, 0, 10),
        lambda: predicted_gain(0.5, 100, 10, step_model="A100"),
        lambda: predicted_gain(0.5, 5000, 10, num_slots=1000),
        lambda: predict_trace([], 10),
        lambda: predict_trace(shared_prefix_trace(4, 16), 10_000),
        lambda: shared_prefix_trace(4, 4096),
        lambda: shared_prefix_trace(4, 16, spec="ShareGPT"),
    ],
)
def test_bad_input_is_one_line_error(call):
    with pytest.raises(KVLibError):
        call()
