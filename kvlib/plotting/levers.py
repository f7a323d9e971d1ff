"""Chapter 5's figure: the levers applied one after another, each quantity relative to the baseline.

:func:`draw_chain` draws the rows of :func:`kvlib.chapters.ch05_levers.levers.chain_table`: bytes per token
and
per running sequence, the largest batch, the simulated running batch and throughput.
"""

from __future__ import annotations

from kvlib.plotting.common import axes


def draw_chain(rows: list[dict], context: int, max_num_seqs: int | None = None):
    """Chapter 5: the cumulative effect of the levers, each quantity relative to the baseline (log scale),
    with the scheduler's cap on running requests as a dotted line when ``max_num_seqs`` is given."""
    fig, ax = axes(
        "Levers applied one after another (relative to the baseline)",
        "",
        "x baseline (log scale)",
        logy=True,
        size=(7.5, 4.4),
    )
    steps = range(len(rows))
    lines = {
        "KV bytes per token, smaller by": [rows[0]["KV bytes/token"] / r["KV bytes/token"] for r in rows],
        "KV per running sequence, smaller by": [
            rows[0]["KV per running sequence (MiB)"] / r["KV per running sequence (MiB)"] for r in rows
        ],
        f"max batch at {context:,} (capacity planning)": [
            r[f"max batch at {context:,}"] / rows[0][f"max batch at {context:,}"] for r in rows
        ],
        "mean running batch (simulated)": [
            r["mean running batch"] / rows[0]["mean running batch"] for r in rows
        ],
        "tokens/s (simulated)": [r["x baseline"] for r in rows],
    }
    for (label, values), marker in zip(lines.items(), "osD^v", strict=True):
        ax.plot(steps, values, marker=marker, label=label)
        ax.annotate(
            f"{values[-1]:.3g}x",
            (steps[-1], values[-1]),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    if max_num_seqs:
        cap = max_num_seqs / rows[0]["mean running batch"]
        ax.axhline(cap, color="tab:red", linestyle=":", linewidth=1)
        ax.annotate(
            f"scheduler's cap: {max_num_seqs} running requests",
            (0, cap),
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=7,
            color="tab:red",
        )
    ax.set_xticks(
        list(steps), [f"{r['step']}. {r['lever']}" for r in rows], rotation=20, ha="right", fontsize=8
    )
    ax.set_xlim(-0.3, len(rows) - 0.4)
    ax.legend(fontsize=7, loc="upper left")
    return fig
