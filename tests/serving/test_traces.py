"""Seeded request traces (kvlib.serving.traces): log-normal lengths whose clipped means match the
vLLM paper's, clipped to the maximum length, and Poisson arrivals."""

import math

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.serving.traces import (
    ALPACA,
    SHAREGPT,
    TraceSpec,
    clipped_lognormal_mean,
    make_trace,
    sample_lengths,
    trace_stats,
)


@pytest.mark.parametrize(
    "mu, sigma, low, high", [(4.6, 1.0, 1, 2047), (2.0, 0.5, 1, 20), (7.5, 1.2, 1, 2047)]
)
def test_clipped_lognormal_mean_matches_a_monte_carlo_estimate(mu, sigma, low, high):
    x = np.random.default_rng(0).lognormal(mu, sigma, 400_000)
    assert clipped_lognormal_mean(mu, sigma, low, high) == pytest.approx(
        np.clip(x, low, high).mean(), rel=0.01
    )


@pytest.mark.parametrize("spec", [SHAREGPT, ALPACA, SHAREGPT.scaled(8)], ids=lambda s: s.name)
def test_solved_locations_give_the_target_means(spec):
    assert clipped_lognormal_mean(spec.mu_input, spec.sigma, 1, spec.max_len - 1) == pytest.approx(
        spec.mean_input, rel=1e-6
    )
    inputs, outputs = sample_lengths(spec, 200_000, seed=1)
    assert inputs.mean() == pytest.approx(spec.mean_input, rel=0.02)
    assert outputs.mean() == pytest.approx(spec.mean_output, rel=0.02)
    assert inputs.min() >= 1 and outputs.min() >= 1 and (inputs + outputs).max() <= spec.max_len


def test_lengths_are_seeded_and_long_tailed():
    a, b = sample_lengths(SHAREGPT, 1000, seed=5), sample_lengths(SHAREGPT, 1000, seed=5)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], sample_lengths(SHAREGPT, 1000, seed=6)[0])
    outputs = sample_lengths(SHAREGPT, 20_000, seed=0)[1]
    assert np.percentile(outputs, 99) > 5 * np.median(
        outputs
    )  # sigma = 1: the 99th percentile is ~10x the median


def test_scaled_spec_divides_every_length():
    scaled = SHAREGPT.scaled(8)
    assert (scaled.mean_input, scaled.mean_output, scaled.max_len) == (
        SHAREGPT.mean_input / 8,
        SHAREGPT.mean_output / 8,
        256,
    )
    assert scaled.sigma == SHAREGPT.sigma


def test_poisson_arrivals_have_the_requested_rate():
    requests = make_trace(ALPACA, 4000, rate=50.0, seed=2)
    arrivals = np.array([r.arrival_s for r in requests])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    assert np.diff(arrivals).mean() == pytest.approx(1 / 50, rel=0.05)
    assert all(r.arrival_s == 0 for r in make_trace(ALPACA, 10, math.inf))


def test_requests_carry_seeded_prompts_within_the_vocabulary_and_max_len():
    requests = make_trace(SHAREGPT, 300, math.inf, seed=3, vocab_size=50)
    assert all(max(r.prompt) < 50 and r.total_len <= SHAREGPT.max_len for r in requests)
    assert [r.prompt for r in requests] == [
        r.prompt for r in make_trace(SHAREGPT, 300, math.inf, seed=3, vocab_size=50)
    ]
    stats = trace_stats(requests)
    assert stats["requests"] == 300 and stats["longest total"] <= 2048


def test_a_system_prompt_goes_in_front_of_every_prompt():
    system = tuple(range(100, 140))
    plain = make_trace(ALPACA, 50, math.inf, seed=4)
    with_system = make_trace(ALPACA, 50, math.inf, seed=4, system_prompt=system)
    assert all(
        r.prompt[:40] == system and r.prompt[40:] == p.prompt for r, p in zip(with_system, plain, strict=True)
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: make_trace(ALPACA, 10, 0.0), "rate"),
        (lambda: sample_lengths(ALPACA, 0), "an integer from 1 to"),
        (
            lambda: make_trace(TraceSpec("t", 4, 4, max_len=16), 3, math.inf, system_prompt=(1,) * 16),
            "system prompt",
        ),
        (lambda: TraceSpec("t", 10, 10, sigma=0), "sigma"),
        (lambda: TraceSpec("t", 100, 2000, max_len=2048), "do not fit"),
        (lambda: trace_stats([]), "empty"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(KVLibError, match=match):
        call()
