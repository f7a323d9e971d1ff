"""Tests of kvlib.chapters.ch01_no_cache.article: the NumPy reproduction of the article's experiment."""

import numpy as np
import pytest

import kvlib.chapters.ch01_no_cache.article as article
from kvlib import KVLibError
from kvlib.chapters.ch01_no_cache.article import (
    ARTICLE_FIGURES,
    ArticleSetup,
    cached_loop_traffic,
    cached_step_traffic,
    cached_steps,
    cached_working_set,
    llc_crossing,
    loop_flops,
    loop_with_cache,
    loop_without_cache,
    reproduce,
    step_profile,
)
from kvlib.measure.timing import Timing


def test_both_loops_compute_the_same_last_output():
    setup = ArticleSetup.draw(12, d_model=16, num_layers=3, seed=1)
    a, b = loop_without_cache(setup), loop_with_cache(setup)
    assert a.shape == (1, 16)
    assert np.allclose(a, b, rtol=1e-10, atol=0)


def test_the_last_output_is_attention_of_the_last_token_in_the_last_layer():
    setup = ArticleSetup.draw(5, d_model=8, num_layers=2, seed=2)
    w_q, w_k, w_v = setup.weights[-1]
    x = setup.inputs
    expected = ((x[-1:] @ w_q) @ (x @ w_k).T) @ (x @ w_v)
    assert np.allclose(loop_with_cache(setup), expected)


def test_setups_are_seeded():
    a, b, c = (
        ArticleSetup.draw(4, 8, 1, seed=0),
        ArticleSetup.draw(4, 8, 1, seed=0),
        ArticleSetup.draw(4, 8, 1, seed=1),
    )
    assert np.array_equal(a.inputs, b.inputs) and not np.array_equal(a.inputs, c.inputs)


def test_every_cached_step_gives_the_uncached_loop_s_output_at_that_length():
    setup = ArticleSetup.draw(6, d_model=8, num_layers=2, seed=3)
    outputs = list(cached_steps(setup))
    assert len(outputs) == 6
    for t, out in enumerate(outputs, start=1):
        prefix = ArticleSetup(setup.weights, setup.inputs[:t])
        assert np.allclose(out, loop_without_cache(prefix), rtol=1e-10, atol=0), t


def _fake_interleaved(samples):
    """A stand-in for time_interleaved: runs each function once, returns the given samples."""
    calls = []

    def fake(fns, rounds, number=None, warmup=1, device=None, clock=None):
        assert (number, warmup) == (1, 0)  # each loop run once per sample, none thrown away
        calls.append((tuple(fns), rounds))
        for fn in fns.values():
            fn()
        return {name: Timing(float(np.median(s)), min(s), max(s), tuple(s)) for name, s in samples.items()}

    return fake, calls


def test_reproduce_times_both_loops_by_one_protocol(monkeypatch):
    fake, calls = _fake_interleaved({"without": [9.0, 8.0, 30.0], "with": [2.0, 5.0, 4.0]})
    monkeypatch.setattr(article, "time_interleaved", fake)
    runs = reproduce(lengths=(5, 10), repeats=3)
    assert [r.num_tokens for r in runs] == [5, 10]
    # one call per length, both loops in it, the same number of rounds
    assert calls == [(("without", "with"), 3)] * 2
    # the speedup divides the fastest runs (8 / 2), not medians (9 / 4) or the last runs
    assert all(r.speedup == 4.0 and r.same_output for r in runs)


def test_reproduce_reports_loops_that_disagree(monkeypatch):
    monkeypatch.setattr(article, "loop_with_cache", lambda setup: loop_without_cache(setup) * (1 + 1e-6))
    runs = reproduce(lengths=(6,), repeats=1)
    assert runs[0].same_output is False


def test_reproduce_measures_real_runs():
    runs = reproduce(lengths=(5, 10), repeats=2)
    assert all(r.same_output for r in runs)
    assert all(len(r.without_cache.samples) == len(r.with_cache.samples) == 2 for r in runs)
    with pytest.raises(KVLibError, match="repeats"):
        reproduce(lengths=(5,), repeats=0)


def test_loop_flops_by_hand():
    # d = 4, 2 layers, 3 tokens: sum of t = 6.
    assert loop_flops(3, cached=False, d_model=4, num_layers=2) == 2 * (4 * 16 * 6 + 2 * 16 * 3 + 4 * 4 * 6)
    assert loop_flops(3, cached=True, d_model=4, num_layers=2) == 2 * (6 * 16 * 3 + 4 * 4 * 6)
    # the article's setup at 400 tokens: the uncached loop does 88x the arithmetic
    assert 88 < loop_flops(400, cached=False) / loop_flops(400, cached=True) < 89


def test_cached_step_bytes_by_hand():
    # d = 4, 2 layers, float64, 3 tokens: weights 3 x 16, old rows 2 x 2 x 4, new rows 2 x 3 x 4, per layer.
    assert cached_working_set(3, d_model=4, num_layers=2) == 2 * (48 + 16 + 24) * 8
    assert cached_step_traffic(3, d_model=4, num_layers=2) == 2 * (48 + 16 + 24 + 24) * 8
    assert cached_loop_traffic(3, d_model=4, num_layers=2) == sum(
        cached_step_traffic(t, 4, 2) for t in (1, 2, 3)
    )
    assert (
        cached_working_set(400) == 4 * (3 * 256 * 256 + 2 * 256 * 799) * 8
    )  # 18.5 MiB at the article's length


def test_llc_crossing_is_the_first_length_past_the_cache():
    for llc in (8 << 20, 32 << 20, 480 << 20):
        t = llc_crossing(llc)
        assert cached_working_set(t) > llc >= cached_working_set(t - 1)
    assert llc_crossing(1 << 20) == 1  # the weights alone exceed 1 MiB
    with pytest.raises(KVLibError, match="llc"):
        llc_crossing(0)


def test_step_profile_times_every_step():
    seconds = step_profile(12, repeats=2)
    assert seconds.shape == (12,) and np.all(seconds > 0)
    with pytest.raises(KVLibError, match="repeats"):
        step_profile(4, repeats=0)


def test_article_figures_are_its_table():
    assert sorted(ARTICLE_FIGURES) == [100, 200, 400]
    for slow, fast, speedup in ARTICLE_FIGURES.values():
        assert abs(slow / fast - speedup) < 0.1  # the article's speedups are its times' ratios, rounded


@pytest.mark.parametrize(
    "kwargs", [dict(num_tokens=0), dict(num_tokens=3, d_model=0), dict(num_tokens=3, num_layers=1.5)]
)
def test_bad_sizes_are_named(kwargs):
    with pytest.raises(KVLibError, match="must be a positive integer"):
        ArticleSetup.draw(**kwargs)
    with pytest.raises(KVLibError, match="must be a positive integer"):
        cached_working_set(**kwargs)
