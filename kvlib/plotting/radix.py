"""Chapter 11's figures (a radix prefix tree, and cache-aware routing): each cache's hit rate against its
capacity on both traces, and the prefix-aware router's hit rate and p99 TTFT against its balance
threshold beside round-robin and least-loaded."""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvlib.plotting.common import axes


def draw_hit_rates(rows_by_trace: dict[str, list[dict]], caches: tuple[str, ...]):
    """Hit rate against slots, one line per cache and trace: ``rows_by_trace`` maps a trace's name to
    the rows of :func:`kvlib.chapters.ch11_radix_routing.hit_rates.hit_rate_rows` (a ``"slots"`` column
    and one per cache of ``caches``); the first trace solid, the next dashed, a colour per cache."""
    fig, ax = axes(
        "Prefix-cache hit rate at equal capacity (counted)",
        "token slots of the cache",
        "prompt tokens found cached (%)",
        logx=True,
    )
    styles = ("-", "--", ":")
    for (trace, rows), style in zip(rows_by_trace.items(), styles, strict=False):
        slots = [r["slots"] for r in rows]
        for k, cache in enumerate(caches):
            ax.plot(
                slots,
                [100 * r[cache] for r in rows],
                style,
                color=f"C{k}",
                marker="o",
                ms=3,
                label=f"{cache} ({trace})",
            )
    ax.legend(fontsize=7)
    return fig


def draw_routing(rows: list[dict]):
    """Two panels against the prefix-aware router's ``balance_abs_threshold`` (the rows of
    :func:`kvlib.chapters.ch11_radix_routing.routing.routing_rows`): hit rate (%) and p99 TTFT (ms), the
    round-robin and least-loaded rows drawn as horizontal lines; "never" is drawn right of the largest."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.2, 3.6), layout="constrained")
    aware = [r for r in rows if r["policy"] == "prefix-aware"]
    labels = [str(r["balance_abs_threshold"]) for r in aware]
    x = list(range(len(aware)))
    for ax, column, title, scale in (
        (left, "hit rate", "prompt tokens found cached (%, simulated)", 100),
        (right, "p99 TTFT (s)", "p99 TTFT (ms, simulated)", 1000),
    ):
        ax.plot(x, [scale * r[column] for r in aware], "o-", color="C2", label="prefix-aware")
        for r, color in zip((r for r in rows if r["policy"] != "prefix-aware"), ("C0", "C1"), strict=False):
            ax.axhline(scale * r[column], color=color, ls="--", label=r["policy"])
        ax.set_xticks(x, labels)
        ax.set_xlabel("balance_abs_threshold of the prefix-aware router")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    right.set_ylim(bottom=0)
    left.legend(fontsize=8)
    return fig
