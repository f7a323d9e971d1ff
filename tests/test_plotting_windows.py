"""Chapter 10's figure: capacity curves per shape (freed solid, kept dashed, log scale) and the held
blocks per group kind; rows built by hand."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from kvlib.plotting.windows import draw_window_capacity


def test_window_capacity_draws_two_lines_per_shape_and_one_per_group_kind():
    sweep = [
        {"shape": s, "context": c, "kept": k, "freed": f}
        for s, rows in (("A", ((2048, 10, 10), (1024, 20, 20))), ("B", ((1024, 5, 5), (2048, 3, 6))))
        for c, k, f in rows
    ]
    trace = [{"length": 1, "full": 1, "sliding": 1}, {"length": 2, "full": 2, "sliding": 1}]
    fig = draw_window_capacity(sweep, trace, "B")
    left, right = fig.axes
    assert left.get_yscale() == "log" and len(left.lines) == 4
    assert list(left.lines[0].get_xdata()) == [1024, 2048] and list(left.lines[2].get_ydata()) == [5, 6]
    assert [line.get_label() for line in right.lines] == ["full groups", "sliding groups"]
    assert list(right.lines[1].get_ydata()) == [1, 1]
    plt.close(fig)
