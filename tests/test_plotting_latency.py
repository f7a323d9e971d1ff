"""Chapter 4's figures of the paper's comparison (kvlib.plotting.latency): one panel per trace, a
curve per policy, the threshold and each sustained rate drawn where the rule puts them, and bad
input refused with a one-line KVLibError. Rows are built by hand: nothing is simulated."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from kvlib import KVLibError
from kvlib.chapters.ch04_serving.rate_comparison import SustainedRates
from kvlib.plotting.latency import draw_latency_percentiles, draw_rate_curves


def row(trace, policy, rate, latency):
    # TTFT and TPOT made up from the latency so that each curve has its own values
    return {
        "trace": trace,
        "policy": policy,
        "rate": rate,
        "s per token": latency,
        "ttft p50 (s)": 10 * latency,
        "ttft p99 (s)": 20 * latency,
        "tpot p50 (s)": latency / 2,
        "tpot p99 (s)": latency,
    }


ROWS = [
    row(trace, policy, x * f, latency)
    for trace in ("a", "b")
    for policy, x in (("max", 1.0), ("oracle", 2.0), ("paged", 4.0))
    for f, latency in ((0.5, 1.0), (1.0, 1.5), (1.2, 9.0))
]
THRESHOLDS = {
    "a": SustainedRates("a", 1.0, 3.0, {"max": 1.1, "oracle": 2.2, "paged": 4.4}),
    "b": SustainedRates("b", 0.5, 3.0, {"max": 1.1, "oracle": None, "paged": 4.4}),
}


def test_rate_curves_draw_a_panel_per_trace_with_the_rule():
    fig = draw_rate_curves(ROWS, THRESHOLDS)
    a, b = fig.axes
    assert (a.get_title(), b.get_title()) == ("a", "b")
    # three policy curves of three points each, and the threshold at 3 x unloaded
    curves = [line for line in a.get_lines() if line.get_label() in ("max", "oracle", "paged")]
    assert [len(line.get_xdata()) for line in curves] == [3, 3, 3]
    assert [line.get_ydata()[0] for line in a.get_lines() if "threshold" in line.get_label()] == [3.0]
    assert [line.get_ydata()[0] for line in b.get_lines() if "threshold" in line.get_label()] == [1.5]
    # a mark per sustained rate, on the threshold (b's oracle never crossed: no mark), plus the legend's
    marks = [tuple(c.get_offsets()[0]) for c in a.collections if len(c.get_offsets())]
    assert sorted(marks) == [(1.1, 3.0), (2.2, 3.0), (4.4, 3.0)]
    assert len([c for c in b.collections if len(c.get_offsets())]) == 2
    assert a.get_xscale() == "log" and a.get_yscale() == "log"
    plt.close(fig)


def test_latency_percentiles_draw_ttft_and_tpot_p50_and_p99():
    fig = draw_latency_percentiles(ROWS, "a")
    ttft, tpot = fig.axes
    labels = [line.get_label() for line in ttft.get_lines()]
    assert labels == ["max p50", "max p99", "oracle p50", "oracle p99", "paged p50", "paged p99"]
    # max's p99 TTFT at its three rates: 20 x (1.0, 1.5, 9.0)
    assert list(ttft.get_lines()[1].get_ydata()) == [20.0, 30.0, 180.0]
    assert list(tpot.get_lines()[0].get_ydata()) == [0.5, 0.75, 4.5]
    plt.close(fig)


def test_bad_input_is_refused():
    with pytest.raises(KVLibError, match="needs rows"):
        draw_rate_curves([], THRESHOLDS)
    with pytest.raises(KVLibError, match="no threshold for trace 'b'"):
        draw_rate_curves(ROWS, {"a": THRESHOLDS["a"]})
    with pytest.raises(KVLibError, match="no rows of trace 'c'"):
        draw_latency_percentiles(ROWS, "c")
