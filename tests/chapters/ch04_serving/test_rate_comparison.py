"""The paper's comparison (kvlib.chapters.ch04_serving.rate_comparison): the unloaded latency by hand, the
crossing rule on synthetic curves, sustained rates and their ratios, the sweep's order on a small
configuration, and bench's fields on a stubbed sweep."""

import math

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.chapters.ch04_serving import rate_comparison as rc
from kvlib.serving.results import RunResult
from kvlib.serving.roofline import roofline_step_model
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import ALPACA, SHAREGPT, Request, TraceSpec, make_trace
from kvlib.serving.types import SeqState
from tests.serving.test_latency import hand_run

STEP = StepTimeModel(1.0, 0.5, 0.01, 0.1)  # fixed, per sequence, per context token, per prompt token
SMALL = TraceSpec("small", 30, 60, max_len=256)


def test_unloaded_latency_by_hand():
    requests = [Request(0, 0.0, tuple(range(10)), 3), Request(1, 5.0, (1, 2, 3, 4), 1)]
    # request 0: prefill 1 + 0.5 + 0.1 x 10 = 2.5; decodes read 11, then 12 tokens:
    # 2 x 1.5 + 0.01 x 23 = 3.23; (2.5 + 3.23) / 3 = 1.91.
    # Request 1: prefill 1 + 0.5 + 0.1 x 4 = 1.9, its only token: 1.9 / 1
    assert rc.unloaded_latency(requests, STEP) == pytest.approx((1.91 + 1.9) / 2)
    with pytest.raises(KVLibError, match="at least one request"):
        rc.unloaded_latency([], STEP)


def test_unloaded_latency_by_hand_with_an_overlapped_step():
    # the larger of memory (1 + 0.01 x context) and compute (0.5 x sequences + 0.1 x prompt tokens)
    step = StepTimeModel(1.0, 0.5, 0.01, 0.1, overlapped=True)
    # request 0: prefill max(1, 0.5 + 0.1 x 10 = 1.5) = 1.5; decodes read 11, then 12 tokens: max(1.11, 0.5)
    # + max(1.12, 0.5) = 2.23; (1.5 + 2.23) / 3. Request 1: prefill max(1, 0.5 + 0.4) = 1, its only token
    requests = [Request(0, 0.0, tuple(range(10)), 3), Request(1, 5.0, (1, 2, 3, 4), 1)]
    assert rc.unloaded_latency(requests, step) == pytest.approx((3.73 / 3 + 1.0) / 2)


@pytest.mark.parametrize("step", [STEP, roofline_step_model(), roofline_step_model(overlapped=False)])
def test_the_simulator_at_a_vanishing_rate_gives_the_unloaded_latency(step):
    # arrivals a million seconds apart on average: every request is alone on the server
    requests = make_trace(SMALL, 6, 1e-6, seed=2)
    run = simulate(requests, "paged", 1024, step, SMALL.max_len)
    assert run.normalized_latency == pytest.approx(rc.unloaded_latency(requests, step), rel=1e-9)


def test_crossing_rate_interpolates_in_log_rate_and_log_latency():
    # between (2, 1.5) and (4, 6): share (ln 3 - ln 1.5) / (ln 6 - ln 1.5) = ln 2 / ln 4 = 1/2 of the
    # way from ln 2 to ln 4: 2 ** 1.5. The points may come in any order.
    assert rc.crossing_rate([4, 1, 2], [6.0, 1.0, 1.5], 3.0) == pytest.approx(2**1.5)
    # the first crossing counts, even if the curve dips back below: between (1, 1) and (2, 4),
    # 2 ** (ln 3 / ln 4) = sqrt(3)
    assert rc.crossing_rate([1, 2, 3, 4], [1.0, 4.0, 2.0, 8.0], 3.0) == pytest.approx(math.sqrt(3))
    # a point exactly at the threshold is not above it
    assert rc.crossing_rate([1, 2], [1.0, 3.0], 3.0) is None
    # above from the first point: the grid starts after the knee
    assert rc.crossing_rate([1, 2], [4.0, 8.0], 3.0) is None


def curve(trace, policy, points, unloaded=1.0):
    return [
        {"trace": trace, "policy": policy, "rate": r, "s per token": s, "unloaded s per token": unloaded}
        for r, s in points
    ]


def synthetic_rows(trace, scales):
    """Each policy's curve is 1 s/token at rate x, 9 at 2x (unloaded 1, threshold 3): it crosses at
    share ln 3 / ln 9 = 1/2 of the way in log rate, x sqrt(2)."""
    return [row for policy, x in scales.items() for row in curve(trace, policy, [(x, 1.0), (2 * x, 9.0)])]


SHARE_SCALES = {"max": 1.0, "pow2": 2.0, "oracle": 3.0, "paged": 6.0}
ALPACA_SCALES = {"max": 1.0, "pow2": 4.0, "oracle": 5.0, "paged": 10.0}


def test_sustained_rates_and_ratios_on_synthetic_curves():
    rows = synthetic_rows("a", SHARE_SCALES) + synthetic_rows("b", ALPACA_SCALES)
    sustained = rc.sustained_rates(rows)
    assert list(sustained) == ["a", "b"]
    a = sustained["a"]
    assert (a.unloaded_s, a.multiple, a.threshold_s) == (1.0, 3.0, 3.0)
    for policy, x in SHARE_SCALES.items():
        assert a.rates[policy] == pytest.approx(x * math.sqrt(2))
    # the same multiple of the same point of every curve: the ratios are those of the scales
    assert rc.rate_ratios(a) == pytest.approx({"max": 6.0, "pow2": 3.0, "oracle": 2.0})
    assert rc.rate_ratios(sustained["b"]) == pytest.approx({"max": 10.0, "pow2": 2.5, "oracle": 2.0})
    # a threshold of 9 x unloaded: no point is above 9, so no policy crosses and no ratio exists
    high = rc.sustained_rates(rows, multiple=9)["a"]
    assert high.rates["paged"] is None
    with pytest.raises(KVLibError, match="no crossing"):
        rc.rate_ratios(high)


def test_the_comparison_table_sets_the_papers_bands_beside_sharegpt_only():
    rows = synthetic_rows(SHAREGPT.name, SHARE_SCALES) + synthetic_rows(ALPACA.name, ALPACA_SCALES)
    share, alpaca = rc.comparison_table(rc.sustained_rates(rows))
    assert share["paged / oracle"] == pytest.approx(2.0) and share["paper: paged / oracle"] == "1.7-2.7"
    assert share["paper: paged / max"] == "2.7-8"
    assert not any(key.startswith("paper") for key in alpaca)


@pytest.mark.parametrize("bad", [1, 0.5, math.nan, math.inf, "3"])
def test_sustained_rates_refuses_a_bad_multiple(bad):
    with pytest.raises(KVLibError, match="threshold multiple"):
        rc.sustained_rates(synthetic_rows("a", SHARE_SCALES), multiple=bad)


def test_sustained_rates_needs_rows_and_the_sweep_needs_positive_fractions():
    with pytest.raises(KVLibError, match="no rows"):
        rc.sustained_rates([])
    for bad in ([], [0.0, 1.0], [math.inf]):
        with pytest.raises(KVLibError, match="fractions"):
            rc.rate_sweep(SMALL, 10, fractions=bad, progress=False)


def test_the_sweep_on_a_small_config_orders_the_policies():
    fractions = (0.5, 0.9, 1.0, 1.1, 1.25, 1.5)
    rows = rc.rate_sweep(SMALL, 100, step_model=roofline_step_model(), num_slots=1024, fractions=fractions)
    # each policy's grid starts at the given fractions of its own capacity
    for policy in ("max", "paged"):
        mine = [r["rate / capacity"] for r in rows if r["policy"] == policy]
        assert mine[: len(fractions)] == pytest.approx(fractions)
    rates = rc.sustained_rates(rows)["small"].rates
    # the batch each policy's memory allows: max reserves 256 slots (4 requests in 1,024), pow2 less,
    # oracle the true length, paged only what is written
    assert rates["max"] < rates["pow2"] < rates["oracle"] < rates["paged"]


def test_a_grid_that_ends_below_the_threshold_is_extended():
    rows = rc.rate_sweep(SMALL, 100, step_model=roofline_step_model(), num_slots=1024, fractions=(0.25, 0.5))
    for policy in ("max", "pow2", "oracle", "paged"):
        mine = [r for r in rows if r["policy"] == policy]
        threshold = rc.THRESHOLD_MULTIPLE * mine[0]["unloaded s per token"]
        assert 2 < len(mine) <= 2 + rc.MAX_EXTENSIONS
        # every added rate is 1.25 x the one before, added because that one was still below the threshold
        for before, after in zip(mine[1:], mine[2:], strict=False):
            assert (
                after["rate"] == pytest.approx(1.25 * before["rate"]) and before["s per token"] <= threshold
            )
        assert mine[-1]["s per token"] > threshold or len(mine) == 2 + rc.MAX_EXTENSIONS


def busy_run(policy, num_seqs, durations):
    """A run of two requests of 2 output tokens whose every step has a request waiting."""
    steps = {
        "num_seqs": np.array(num_seqs, dtype=float),
        "new_tokens": np.array(num_seqs, dtype=float),  # one token per sequence computed
        "duration_s": np.array(durations, dtype=float),
        "num_waiting": np.ones(len(num_seqs)),
    }
    finished = [SeqState(Request(i, 0.0, (1,), 2), [1]) for i in range(2)]
    return RunResult(policy, 64, finished, steps, 0)


def test_batch_table_splits_the_capacity_ratio_into_batch_and_step():
    # paged: 2 steps of 4 sequences, 2 s each: batch 4, 8 tokens / 4 s = 2 tokens/s, 1 request/s
    # (2 tokens each)
    # oracle: 4 steps of 1 sequence, 1 s each: batch 1, 1 token/s, 0.5 requests/s
    runs = {
        "oracle": busy_run("oracle", [1, 1, 1, 1], [1, 1, 1, 1]),
        "paged": busy_run("paged", [4, 4], [2, 2]),
    }
    oracle, paged = rc.batch_table(runs)
    assert (oracle["mean batch"], oracle["step (ms)"], oracle["capacity (req/s)"]) == (1.0, 1000.0, 0.5)
    assert paged["step (ms)"] == 2000.0
    # capacity ratio 1 / 0.5 = 2 = batch ratio 4 x step ratio 1 / 2
    assert (
        oracle["paged's batch / its"],
        oracle["its step / paged's"],
        oracle["paged's capacity / its"],
    ) == (
        4.0,
        0.5,
        2.0,
    )


def test_bench_fields_on_a_stubbed_sweep(monkeypatch):
    scales = {SHAREGPT.name: SHARE_SCALES, ALPACA.name: ALPACA_SCALES}
    calls = []

    def sweep(spec, num_requests, progress=True):
        return synthetic_rows(spec.name, scales[spec.name])

    def at_rate(spec, num_requests, rate):
        calls.append((spec.name, rate))
        return {p: hand_run() for p in ("max", "pow2", "oracle", "paged")}

    monkeypatch.setattr(rc, "rate_sweep", sweep)
    monkeypatch.setattr(rc, "latency_at_rate", at_rate)
    result = rc.bench()
    assert result["rate_ratio_paged_vs_oracle"] == 2.0 and result["rate_ratio_paged_vs_max"] == 6.0
    assert (
        result["rate_ratio_paged_vs_oracle_alpaca"] == 2.0
        and result["rate_ratio_paged_vs_max_alpaca"] == 10.0
    )
    # the oracle's ShareGPT rate, 3 sqrt(2) = 4.2426
    assert calls == [(SHAREGPT.name, pytest.approx(3 * math.sqrt(2)))]
    assert result["rate_for_latency_percentiles"] == 4.243
    assert result["sustained_rate_sharegpt"] == {"max": 1.414, "pow2": 2.828, "oracle": 4.243, "paged": 8.485}
    # the hand-built run of test_latency: TTFT p99 0.985, TPOT p99 1.48
    assert result["ttft_p99_s"] == dict.fromkeys(("max", "pow2", "oracle", "paged"), 0.985)
    assert result["tpot_p99_s"] == dict.fromkeys(("max", "pow2", "oracle", "paged"), 1.48)
    # and its ITL: four gaps of one 0.5 s step each, so every percentile is 0.5
    assert result["itl_p99_s"] == dict.fromkeys(("max", "pow2", "oracle", "paged"), 0.5)
    assert result["threshold_multiple"] == 3.0
