"""Chapter 11's figures: a line per cache and trace in percent, styles by trace; the routing panels with the
baselines as horizontal lines and "never" as the last tick; rows are built by hand."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from kvlib.plotting.radix import draw_hit_rates, draw_routing


def test_hit_rates_draw_a_line_per_cache_and_trace_in_percent():
    rows = [{"slots": 1024, "a": 0.5, "b": 0.25}, {"slots": 2048, "a": 0.75, "b": 0.5}]
    fig = draw_hit_rates({"one": rows, "two": rows}, ("a", "b"))
    (ax,) = fig.axes
    assert len(ax.lines) == 4 and list(ax.lines[0].get_ydata()) == [50.0, 75.0]
    assert ax.lines[0].get_linestyle() == "-" and ax.lines[2].get_linestyle() == "--"
    assert ax.get_xscale() == "log"
    plt.close(fig)


def test_routing_draws_the_sweep_and_both_baselines():
    base = {"hit rate": 0.4, "p99 TTFT (s)": 0.1}
    rows = [
        {"policy": "round-robin", "balance_abs_threshold": None, **base},
        {"policy": "least-loaded", "balance_abs_threshold": None, "hit rate": 0.3, "p99 TTFT (s)": 0.2},
        {"policy": "prefix-aware", "balance_abs_threshold": 8, "hit rate": 0.6, "p99 TTFT (s)": 0.05},
        {"policy": "prefix-aware", "balance_abs_threshold": "never", "hit rate": 0.5, "p99 TTFT (s)": 1.0},
    ]
    fig = draw_routing(rows)
    left, right = fig.axes
    assert list(left.lines[0].get_ydata()) == [60.0, 50.0] and list(right.lines[0].get_ydata()) == [
        50.0,
        1000.0,
    ]
    assert list(left.lines[1].get_ydata()) == [40.0, 40.0] and list(left.lines[2].get_ydata()) == [30.0, 30.0]
    assert [t.get_text() for t in right.get_xticklabels()] == ["8", "never"] and right.get_ylim()[0] == 0
    plt.close(fig)
