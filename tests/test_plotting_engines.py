"""Chapter 8's figures: one point per row in budget order ("off" last), both resume costs with the
crossing marked; rows are built by hand."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from kvlib.chapters.ch08_serving_engines.swap_analysis import BreakEven
from kvlib.plotting.engines import draw_break_even, draw_chunked_tradeoff


def test_chunked_tradeoff_draws_each_series_in_budget_order_with_off_last():
    rows = [
        {"series": m, "budget": b, "ttft_p99_s": t, "itl_p99_s": g}
        for m in ("sum", "max")
        for b, t, g in (("off", 4.0, 0.04), (256, 3.0, 0.02), (512, 3.5, 0.03))
    ]
    fig = draw_chunked_tradeoff(rows)
    left, right = fig.axes
    assert [t.get_text() for t in left.get_xticklabels()] == ["256", "512", "off"]
    first = left.lines[0]
    assert list(first.get_xdata()) == [0, 1, 2] and list(first.get_ydata()) == [3.0, 3.5, 4.0]
    assert list(right.lines[0].get_ydata()) == [20.0, 30.0, 40.0]  # milliseconds
    assert [line.get_label() for line in right.lines] == ["sum", "max"] and left.get_yscale() == "log"
    plt.close(fig)


def test_break_even_draws_both_lines_and_marks_the_crossing():
    # recompute 1 + 2 L, swap 10 + 1 L (seconds): they cross at L = 9
    line = BreakEven(1.0, 2.0, 10.0, 1.0, tie_bandwidth=1.0)
    fig = draw_break_even(line, max_tokens=20)
    (ax,) = fig.axes
    recompute, swap, crossing = ax.lines
    assert np.allclose(recompute.get_ydata(), 1e3 * (1 + 2 * np.arange(1, 21)))
    assert np.allclose(swap.get_ydata(), 1e3 * (10 + np.arange(1, 21)))
    assert list(crossing.get_xdata()) == [9, 9]
    plt.close(fig)
