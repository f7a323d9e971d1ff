"""Chapter 7's figures (What a smaller cache costs): quality against KV bytes per token, every lever at once.

Both functions draw the rows of :func:`kvlib.chapters.ch07_quality.tradeoffs.ratio_rows`, one point per
setting, on a log axis of KV bytes per token with the full cache's bytes marked:

- :func:`draw_pareto`: the perplexity ratio (1.0 = the full cache's), and the Pareto front
  (:func:`~kvlib.chapters.ch07_quality.tradeoffs.pareto_front`) as a staircase: the lowest ratio any setting
  reaches with at most that many bytes;
- :func:`draw_recall`: the recall of the retrieval probe, which the perplexity ratio hides
  (the probe's answers are a small share of the tokens) and which eviction and fewer heads
  are the first to lose.

Each lever family keeps one colour (quantized formats blue, fewer K/V heads green, eviction
red to purple) and each method its own marker, in both figures; every point carries a short
label such as "int4 g8", "kivi2", "GQA-2 up" or "h2o 128".
"""

from __future__ import annotations

import itertools
import math
import numbers
import re

from matplotlib.ticker import FuncFormatter, NullFormatter

from kvlib import KVLibError
from kvlib.chapters.ch07_quality.tradeoffs import RatioRow, pareto_front
from kvlib.plotting.common import axes

# method of a RatioRow -> (legend entry, colour, marker); a family shares a colour
SERIES = {
    "full cache": ("full cache (fp16)", "black", "*"),
    "int8": ("quantized, per token", "tab:blue", "o"),
    "fp8": ("quantized, per token", "tab:blue", "o"),
    "int4": ("quantized, per token", "tab:blue", "o"),
    "int2": ("quantized, per token", "tab:blue", "o"),
    "kivi4": ("quantized, KIVI", "tab:blue", "D"),
    "kivi2": ("quantized, KIVI", "tab:blue", "D"),
    "mean-pooled": ("fewer KV heads, mean-pooled", "tab:green", "v"),
    "one head kept": ("fewer KV heads, one kept", "tab:olive", "<"),
    "one head kept + uptrained": ("fewer KV heads, kept + uptrained", "tab:olive", ">"),
    "mean-pooled + uptrained": ("fewer KV heads, uptrained", "tab:green", "^"),
    "window": ("eviction, sliding window", "tab:red", "s"),
    "sinks": ("eviction, StreamingLLM (sinks)", "tab:orange", "P"),
    "h2o": ("eviction, H2O", "tab:purple", "X"),
}
LABEL_GAP_PT = 7  # least vertical distance between two stacked labels
LABEL_WIDTH_PT = 40  # points closer than this along x have their labels stacked
FIGURE_SIZE = (8.6, 4.6)  # inches: the axes and, on the right, the legend
HEAD_SUFFIX = {
    "mean-pooled": "mean",
    "one head kept": "kept",
    "mean-pooled + uptrained": "up",
    "one head kept + uptrained": "kept up",
}


def _check_rows(rows, what: str = "rows") -> list[RatioRow]:
    """``rows`` as a list of RatioRow with positive bytes and known methods, or a one-line KVLibError."""
    if isinstance(rows, RatioRow) or not hasattr(rows, "__iter__"):
        raise KVLibError(
            f"{what} must be a list of RatioRow (kvlib.chapters.ch07_quality.tradeoffs.ratio_rows)"
        )
    rows = list(rows)
    if not rows:
        raise KVLibError(
            f"{what} is empty: nothing to draw (pass kvlib.chapters.ch07_quality.tradeoffs.ratio_rows(...))"
        )
    for r in rows:
        if not isinstance(r, RatioRow):
            raise KVLibError(f"{what} must hold RatioRow, not {type(r).__name__}")
        if r.method not in SERIES:
            raise KVLibError(f"unknown method {r.method!r}; the chapter's figures draw {', '.join(SERIES)}")
        for field in ("kv_bytes_per_token", "kv_fraction", "ppl_ratio"):
            value = getattr(r, field)
            _check_number(r, field, _is_real(value) and value > 0, "a positive number")
        recall = r.probe_recall
        _check_number(r, "probe_recall", _is_real(recall) and 0 <= recall <= 1, "a number in [0, 1]")
    return rows


def _is_real(value) -> bool:
    """A finite real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_number(row: RatioRow, field: str, ok: bool, what: str) -> None:
    """A one-line KVLibError naming ``row`` and ``field`` unless ``ok``."""
    if not ok:
        value = getattr(row, field)
        raise KVLibError(f"{row.method} at {row.setting!r}: {field} must be {what}, not {value!r}")


def full_cache_bytes(rows: list[RatioRow]) -> float:
    """The full cache's KV bytes per token, which every row's ``kv_fraction`` is relative to.

    Rows of different sweeps (different models) disagree on it: a one-line KVLibError then.
    """
    values = [r.kv_bytes_per_token / r.kv_fraction for r in rows]
    if max(values) > min(values) * (1 + 1e-6):
        raise KVLibError(
            f"the rows disagree on the full cache's bytes ({min(values):g} to {max(values):g}): "
            "draw rows of one sweep"
        )
    return values[0]


def point_label(row: RatioRow, rows: list[RatioRow]) -> str:
    """A short name for ``row``: "int4 g8", "kivi4 r32", "GQA-2 up", "MQA kept", "h2o 128", "full cache".

    A quantized format names its group (g) or KIVI residual (r) only where the rows hold the
    same format at more than one of them.
    """
    numbers = _numbers(row.setting)
    if row.method in HEAD_SUFFIX and numbers:
        heads = "MQA" if numbers[0] == 1 else f"GQA-{numbers[0]}"
        return f"{heads} {HEAD_SUFFIX[row.method]}"
    if row.method in ("window", "sinks", "h2o") and numbers:
        return f"{row.method} {numbers[0]}"
    if row.method == "full cache":
        return row.method
    knobs = [_numbers(r.setting) for r in rows if r.method == row.method]  # (group, residual) each
    label = row.method
    for index, letter in enumerate("gr"):
        if index < len(numbers) and len({k[index : index + 1] for k in knobs}) > 1:
            label += f" {letter}{numbers[index]}"
    return label


def _numbers(setting: str) -> tuple[int, ...]:
    """The integers of a setting, in order: "group 16, residual 128" -> (16, 128)."""
    return tuple(int(n) for n in re.findall(r"\d+", setting))


def _ratio_tick(value: float, _pos=None) -> str:
    """A log axis's ratio ticks as plain numbers (0.5, 2, 30), only for 1, 2, 3 and 5 of each decade."""
    leading = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0
    return f"{value:g}" if any(math.isclose(leading, d) for d in (1, 2, 3, 5)) else ""


def _points(ax, rows: list[RatioRow], value) -> None:
    """One scatter per legend entry (a family's colour, a method's marker)."""
    by_series: dict[str, list[RatioRow]] = {}
    for r in rows:
        by_series.setdefault(SERIES[r.method][0], []).append(r)
    for name, members in by_series.items():
        _, colour, marker = SERIES[members[0].method]
        ax.scatter(
            [r.kv_bytes_per_token for r in members],
            [value(r) for r in members],
            color=colour,
            marker=marker,
            s=70 if marker == "*" else 30,
            label=name,
            zorder=3,
        )


def _labels(ax, rows: list[RatioRow], value) -> None:
    """Each point's :func:`point_label`, stacked upwards where points lie closer than a label's width.

    Call it once the limits are final: distances are reckoned in points from them.
    """
    (xmin, xmax), (ymin, ymax) = ax.get_xlim(), ax.get_ylim()
    if ax.get_yscale() == "log":
        along_y, low = (lambda r: math.log(value(r))), math.log(ymin)
        span = math.log(ymax / ymin)
    else:
        along_y, low, span = value, ymin, ymax - ymin
    box = ax.get_position()  # the axes' share of the figure
    x_pt = box.width * ax.figure.get_figwidth() * 72 / math.log(xmax / xmin)  # points per e-fold of x
    y_pt = box.height * ax.figure.get_figheight() * 72 / span  # points per unit along y (linear or log)
    height = box.height * ax.figure.get_figheight() * 72  # the axes' height in points
    for column in _columns(rows, x_pt):
        column = sorted(column, key=value)
        at = [(along_y(r) - low) * y_pt for r in column]  # each point's height in points
        placed = list(itertools.accumulate(at, lambda below, here: max(here, below + LABEL_GAP_PT)))
        overflow = max(0.0, placed[-1] - (height - LABEL_GAP_PT))  # a stack that would leave the axes
        for r, point, label in zip(column, at, placed, strict=True):
            ax.annotate(
                point_label(r, rows),
                (r.kv_bytes_per_token, value(r)),
                xytext=(4, label - overflow - point - 2),
                textcoords="offset points",
                fontsize=6,
            )


def _columns(rows: list[RatioRow], x_pt: float) -> list[list[RatioRow]]:
    """Rows in bytes order, in runs whose labels would overlap side by side (x_pt: points per e-fold)."""
    columns: list[list[RatioRow]] = []
    for r in sorted(rows, key=lambda r: r.kv_bytes_per_token):
        first = columns[-1][0].kv_bytes_per_token if columns else None
        if first and math.log(r.kv_bytes_per_token / first) * x_pt < LABEL_WIDTH_PT:
            columns[-1].append(r)
        else:
            columns.append([r])
    return columns


def _bytes_axis(ax, rows: list[RatioRow], full_bytes: float) -> None:
    """Power-of-two ticks of bytes per token, and the full cache's bytes as a dotted line named at the top."""
    low = min(r.kv_bytes_per_token for r in rows)
    ticks = [2**k for k in range(math.floor(math.log2(low)), math.ceil(math.log2(full_bytes)) + 1)]
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(low / 1.25, full_bytes * 1.6)
    ax.axvline(full_bytes, color="black", linestyle=":", linewidth=1)
    ax.annotate(
        f"full cache: {full_bytes:,.0f} B per token",
        (full_bytes, 0.5),
        xycoords=ax.get_xaxis_transform(),  # x in data, y in axes fractions: half way up
        xytext=(-3, 0),
        textcoords="offset points",
        rotation=90,
        ha="right",
        va="center",
        fontsize=7,
    )


def draw_pareto(rows: list[RatioRow], front: list[RatioRow] | None = None, logy: bool = False):
    """Chapter 7: perplexity ratio against KV bytes per token (log), every setting, the Pareto front stepped.

    ``front`` defaults to :func:`~kvlib.chapters.ch07_quality.tradeoffs.pareto_front` of ``rows``: the lowest
    ratio reached with at most a given number of bytes is the staircase through it. ``logy``
    puts the ratio on a log scale too, for when a setting (an MQA not uptrained) lies so far
    above the rest that a linear scale would crush the others onto the line at 1.
    """
    rows = _check_rows(rows)
    front = pareto_front(rows) if front is None else _check_rows(front, "front")
    front = sorted(front, key=lambda r: r.kv_bytes_per_token)
    full_bytes = full_cache_bytes(rows)
    fig, ax = axes(
        "What a smaller cache costs: perplexity against KV bytes",
        "KV bytes per token (log scale)",
        "perplexity / full cache's",
        logx=True,
        size=FIGURE_SIZE,
    )
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_ratio_tick))
        ax.yaxis.set_minor_formatter(FuncFormatter(_ratio_tick))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.step(
        [r.kv_bytes_per_token for r in front],
        [r.ppl_ratio for r in front],
        where="post",
        color="grey",
        linestyle="--",
        linewidth=1,
        label="Pareto front",
        zorder=2,
    )
    _points(ax, rows, lambda r: r.ppl_ratio)
    _bytes_axis(ax, rows, full_bytes)
    _labels(ax, rows, lambda r: r.ppl_ratio)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def draw_recall(rows: list[RatioRow]):
    """Chapter 7: the retrieval probe's recall against KV bytes per token (log), the full cache's a line."""
    rows = _check_rows(rows)
    full_bytes = full_cache_bytes(rows)
    fig, ax = axes(
        "What a smaller cache costs: recall of the register's facts",
        "KV bytes per token (log scale)",
        "probe recall (late queries answered)",
        logx=True,
        size=FIGURE_SIZE,
    )
    full = [r for r in rows if r.method == "full cache"]
    if full:
        ax.axhline(full[0].probe_recall, color="black", linewidth=0.8)
    _points(ax, rows, lambda r: r.probe_recall)
    _bytes_axis(ax, rows, full_bytes)
    ax.set_ylim(-0.05, 1.1)
    _labels(ax, rows, lambda r: r.probe_recall)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig
