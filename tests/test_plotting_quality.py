"""Chapter 7's figures: every row a point in its family's series, a label each, the front stepped,
and bad input refused with a one-line KVLibError. Rows are built by hand: no model is needed."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from kvlib import KVLibError
from kvlib.chapters.ch07_quality.tradeoffs import RatioRow
from kvlib.plotting.quality import draw_pareto, draw_recall, point_label

FULL = 2 * 4 * 8 * 16 * 2  # K and V x 4 layers x 8 KV heads x 16 values x 2 bytes = 2,048 bytes per token


def row(method, setting, kv_bytes, ppl_ratio, recall=0.9):
    return RatioRow(method, setting, kv_bytes, kv_bytes / FULL, ppl_ratio, recall, 0.9)


ROWS = [
    row("full cache", "fp16", FULL, 1.0, 0.95),
    row("int8", "group 16", 1280.0, 1.001),  # 2 x (16 + 4) bytes x 32 heads and layers
    row("int4", "group 16", 768.0, 1.02),  # 2 x (8 + 4) x 32
    row("int4", "group 8", 1024.0, 1.01),  # 2 x (8 + 2 x 4) x 32
    row("kivi2", "group 16, residual 128", 400.0, 1.3),
    row("mean-pooled", "2 KV heads", 512.0, 2.5, 0.5),
    row("one head kept", "1 KV heads", 256.0, 3.0, 0.2),
    row("mean-pooled + uptrained", "2 KV heads", 512.0, 1.1, 0.8),
    row("window", "budget 128", 512.0, 1.4, 0.0),
    row("sinks", "budget 128", 512.0, 1.35, 0.0),
    row("h2o", "budget 128", 512.0, 1.2, 0.3),
]


def scatter_points(ax):
    return sum(len(c.get_offsets()) for c in ax.collections)


def test_pareto_draws_a_point_and_a_label_per_row_and_one_series_per_family_member():
    fig = draw_pareto(ROWS)
    ax = fig.axes[0]
    assert scatter_points(ax) == 11
    # full cache, per token, KIVI, mean-pooled, one kept, uptrained, window, sinks, h2o: 9 series
    assert len(ax.collections) == 9
    labels = [t.get_text() for t in ax.texts]
    assert len(labels) == 11 + 1  # a label per point and the full cache's bytes at the top
    assert "full cache: 2,048 B per token" in labels
    assert {"int4 g8", "int4 g16", "int8", "kivi2", "GQA-2 up", "GQA-2 mean", "MQA kept", "h2o 128"} <= set(
        labels
    )
    assert ax.get_xscale() == "log"
    plt.close(fig)


def test_pareto_front_is_the_staircase_through_the_undominated_rows():
    fig = draw_pareto(ROWS)
    (step,) = [line for line in fig.axes[0].lines if line.get_label() == "Pareto front"]
    # by hand, in bytes order: MQA kept (256, 3.0) has the fewest bytes; kivi2 (400, 1.3); at 512 the
    # uptrained GQA-2 (1.1) beats the other four; then int4 g16 (768, 1.02), int4 g8 (1024, 1.01),
    # int8 (1280, 1.001) and the full cache (2048, 1.0), each better than everything smaller
    xs, ys = step.get_data()
    assert list(xs) == [256.0, 400.0, 512.0, 768.0, 1024.0, 1280.0, 2048.0]
    assert list(ys) == [3.0, 1.3, 1.1, 1.02, 1.01, 1.001, 1.0]
    assert step.get_drawstyle() == "steps-post"
    plt.close(fig)


def test_a_log_ratio_axis_reads_plain_numbers():
    fig = draw_pareto(ROWS, logy=True)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and scatter_points(ax) == 11 and len(ax.texts) == 12
    assert [ax.yaxis.get_minor_formatter()(v, 0) for v in (2, 3, 4, 5, 0.3, 20)] == [
        "2",
        "3",
        "",
        "5",
        "0.3",
        "20",
    ]
    plt.close(fig)


def test_a_given_front_is_drawn_as_given():
    fig = draw_pareto(ROWS, front=[ROWS[4], ROWS[0]])
    (step,) = [line for line in fig.axes[0].lines if line.get_label() == "Pareto front"]
    assert list(step.get_data()[0]) == [400.0, 2048.0]  # sorted by bytes
    plt.close(fig)


def test_recall_draws_every_row_against_bytes_with_the_full_caches_recall_as_a_line():
    fig = draw_recall(ROWS)
    ax = fig.axes[0]
    assert scatter_points(ax) == 11 and len(ax.texts) == 12
    assert any(list(line.get_ydata()) == [0.95, 0.95] for line in ax.lines)
    ys = sorted(y for c in ax.collections for _, y in c.get_offsets())
    assert ys[:2] == [0.0, 0.0]  # window and sinks forget the register
    plt.close(fig)


def test_labels_name_each_setting_compactly():
    assert point_label(row("mean-pooled + uptrained", "1 KV heads", 256.0, 1.2), ROWS) == "MQA up"
    assert point_label(row("one head kept", "4 KV heads", 1024.0, 1.2), ROWS) == "GQA-4 kept"
    assert point_label(row("one head kept + uptrained", "2 KV heads", 512.0, 1.2), ROWS) == "GQA-2 kept up"
    assert point_label(row("sinks", "budget 64", 256.0, 1.2), ROWS) == "sinks 64"
    # one KIVI residual among the rows: no r; two: both named
    kivi = [
        row("kivi4", "group 16, residual 128", 650.0, 1.1),
        row("kivi4", "group 16, residual 32", 700.0, 1.1),
    ]
    assert point_label(ROWS[4], ROWS) == "kivi2"
    assert [point_label(r, kivi) for r in kivi] == ["kivi4 r128", "kivi4 r32"]


def test_points_at_equal_bytes_get_labels_apart():
    fig = draw_pareto([row("full cache", "fp16", FULL, 1.0), row("window", "budget 128", 512.0, 1.2),
                       row("sinks", "budget 128", 512.0, 1.2)])  # fmt: skip
    offsets = sorted(t.xyann[1] for t in fig.axes[0].texts if t.get_text() in ("window 128", "sinks 128"))
    assert offsets[1] - offsets[0] >= 7  # stacked, not drawn over each other
    plt.close(fig)


def test_a_stack_of_labels_at_the_top_stays_inside_the_axes():
    """Six settings at recall 1.0 and nearly equal bytes: the stack moves down rather than over the title."""
    top = [row("full cache", "fp16", FULL, 1.0, 1.0)] + [
        row("int4", f"group {g}", 768.0 + g, 1.0, 1.0) for g in (1, 2, 4, 8, 16, 32)
    ]
    fig = draw_recall(top)
    ax = fig.axes[0]
    fig.canvas.draw()
    axes_top = ax.get_window_extent().y1
    assert all(t.get_window_extent().y1 <= axes_top + 1 for t in ax.texts)
    plt.close(fig)


@pytest.mark.parametrize("draw", [draw_pareto, draw_recall])
@pytest.mark.parametrize(
    "rows, message",
    [
        ([], "empty"),
        (ROWS[0], "list of RatioRow"),
        ([{"method": "int8"}], "must hold RatioRow"),
        ([row("int3", "group 16", 800.0, 1.0)], "unknown method 'int3'"),
        ([RatioRow("int8", "group 16", 0.0, 0.0, 1.0, 0.9, 0.9)], "kv_bytes_per_token must be a positive"),
        ([RatioRow("int8", "group 16", True, 1.0, 1.0, 0.9, 0.9)], "kv_bytes_per_token must be a positive"),
        (
            [RatioRow("int8", "group 16", 1280.0, 0.625, float("nan"), 0.9, 0.9)],
            "ppl_ratio must be a positive",
        ),
        ([RatioRow("int8", "group 16", 1280.0, 0.625, 1.0, 90.0, 0.9)], "probe_recall must be a number in"),
        ([ROWS[0], RatioRow("int8", "group 16", 1280.0, 1.0, 1.0, 0.9, 0.9)], "disagree on the full cache"),
    ],
)
def test_bad_rows_are_refused_in_one_line(draw, rows, message):
    with pytest.raises(KVLibError, match=message) as error:
        draw(rows)
    assert "\n" not in str(error.value)


def test_an_empty_front_is_refused():
    with pytest.raises(KVLibError, match="front is empty"):
        draw_pareto(ROWS, front=[])
