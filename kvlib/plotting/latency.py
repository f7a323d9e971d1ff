"""Chapter 4's figures of the paper's comparison: latency against request rate, the rule that
reads a sustained rate off each curve, and TTFT and TPOT percentiles against the rate.

Both functions draw the rows of :func:`kvlib.chapters.ch04_serving.rate_comparison.rate_sweep`:

- :func:`draw_rate_curves`: normalised latency (s per output token) against request rate, one
  panel per trace, both axes logarithmic, with the trace's threshold as a dashed line and each
  policy's sustained rate (:func:`~kvlib.chapters.ch04_serving.rate_comparison.sustained_rates`) marked where
  its curve crosses it, so that the rule can be seen at work;
- :func:`draw_latency_percentiles`: time to first token and time per output token, median
  (solid) and 99th percentile (dashed), against the rate, for one trace.

The policies keep the colours of :mod:`kvlib.plotting.serving`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from kvlib import KVLibError
from kvlib.plotting.quality import _ratio_tick
from kvlib.plotting.serving import _POLICY_COLORS

_TICKS = FuncFormatter(
    _ratio_tick
)  # plain numbers at 1, 2, 3 and 5 of each decade, as chapter 7's ratio axis


def _curve(rows: list[dict], trace: str, policy: str, key: str) -> list[tuple[float, float]]:
    """(rate, value) of one policy on one trace, by rate."""
    return sorted((r["rate"], r[key]) for r in rows if r["trace"] == trace and r["policy"] == policy)


def _log_axes(ax, title: str, ylabel: str) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(_TICKS)
        axis.set_minor_formatter(_TICKS)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("request rate (requests/s, log scale)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def draw_rate_curves(rows: list[dict], thresholds: dict):
    """Normalised latency against request rate per policy, one panel per trace, with the rule shown.

    ``rows``: :func:`~kvlib.chapters.ch04_serving.rate_comparison.rate_sweep`'s; ``thresholds``: trace ->
    :class:`~kvlib.chapters.ch04_serving.rate_comparison.SustainedRates` (its ``threshold_s``, ``multiple``
    and
    ``rates``), as :func:`~kvlib.chapters.ch04_serving.rate_comparison.sustained_rates` returns.
    """
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    if not traces:
        raise KVLibError("draw_rate_curves needs rows of rate_sweep")
    missing = [t for t in traces if t not in thresholds]
    if missing:
        raise KVLibError(f"no threshold for trace {missing[0]!r}: pass sustained_rates(rows)")
    fig, axs = plt.subplots(
        1, len(traces), figsize=(4.6 * len(traces), 3.8), layout="constrained", squeeze=False
    )
    for ax, trace in zip(axs[0], traces, strict=True):
        rule = thresholds[trace]
        for policy, color in _POLICY_COLORS.items():
            points = _curve(rows, trace, policy, "s per token")
            if not points:
                continue
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, color=color, label=policy)
            rate = rule.rates.get(policy)
            if rate is not None:
                ax.scatter(
                    [rate], [rule.threshold_s], marker="v", s=60, color=color, edgecolor="black", zorder=3
                )
                ax.annotate(
                    f"{rate:.3g}",
                    (rate, rule.threshold_s),
                    xytext=(4, -13),
                    textcoords="offset points",
                    ha="left",
                    fontsize=7,
                    color=color,
                    bbox={
                        "boxstyle": "round,pad=0.1",
                        "facecolor": "white",
                        "edgecolor": "none",
                        "alpha": 0.8,
                    },
                )
        ax.axhline(
            rule.threshold_s,
            color="black",
            linestyle="--",
            linewidth=0.9,
            label=f"threshold: {rule.multiple:g} x unloaded",
        )
        ax.scatter([], [], marker="v", s=60, color="white", edgecolor="black", label="sustained rate (req/s)")
        _log_axes(ax, trace, "normalised latency (s / token)")
        ax.legend(fontsize=7, loc="upper left")
    return fig


def draw_latency_percentiles(rows: list[dict], trace: str):
    """TTFT and TPOT against request rate for one trace: median solid, 99th percentile dashed."""
    if not any(r["trace"] == trace for r in rows):
        raise KVLibError(f"no rows of trace {trace!r}")
    fig, axs = plt.subplots(1, 2, figsize=(9.2, 3.6), layout="constrained")
    metrics = (("ttft", "time to first token (s)"), ("tpot", "time per output token (s)"))
    for ax, (metric, what) in zip(axs, metrics, strict=True):
        for policy, color in _POLICY_COLORS.items():
            for pct, style in (("p50", "-"), ("p99", "--")):
                points = _curve(rows, trace, policy, f"{metric} {pct} (s)")
                if points:
                    label = f"{policy} {pct}"
                    ax.plot(
                        *zip(*points, strict=True), style, marker="o", markersize=2, color=color, label=label
                    )
        _log_axes(ax, f"{trace}: {what.split(' (')[0]}", what)
    axs[0].legend(fontsize=6, ncol=2, loc="upper left")
    return fig
