"""Small matplotlib helpers so that every chapter's figures look alike.

Chapter-specific drawings live here too, one function per figure, each naming its chapter.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker


@matplotlib.ticker.FuncFormatter
def _plain(value, _pos=None) -> str:
    """Log-axis ticks as plain numbers (0.5, 16, 1,000), not powers of ten."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def axes(title: str, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False, size=(6.4, 3.8)):
    """A new figure with one labelled axes (grid on, log scales as asked); returns (fig, ax)."""
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_plain)
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_plain)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


# --------------------------------------------------------------------------- chapter 3: paged KV cache

_SEQ_COLORS = ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#937860", "#64b5cd")
_SHARED = "#dd8452"


def _draw_block(ax, x: float, y: float, filled: int, block_size: int, color: str, label: str, hatch=None):
    """One block as ``block_size`` cells, the first ``filled`` coloured; its label above."""
    for i in range(block_size):
        face = color if i < filled else "white"
        ax.add_patch(plt.Rectangle((x + i / block_size, y), 1 / block_size, 0.6, facecolor=face,
                                   edgecolor="black", linewidth=0.6, hatch=hatch if i < filled else None))
    ax.text(x + 0.5, y + 0.68, label, ha="center", va="bottom", fontsize=7)


def draw_block_tables(snapshots, size=None):
    """Chapter 3: block tables (left: each sequence's logical blocks) pointing into the pool (right).

    ``snapshots``: a list of (title, :class:`kvlib.paged.BlockSnapshot`), drawn side by side.
    Filled cells are token slots in use; blocks shared by several sequences (ref_cnt > 1)
    are orange and hatched; each physical block is labelled with its id and ref_cnt.
    """
    fig, axs = plt.subplots(1, len(snapshots), figsize=size or (4.6 * len(snapshots), 3.8), layout="constrained")
    for ax, (title, snap) in zip([axs] if len(snapshots) == 1 else axs, snapshots):
        _draw_one_snapshot(ax, snap)
        ax.set_title(title, fontsize=9)
    return fig


def _draw_one_snapshot(ax, snap):
    bs, seqs = snap.block_size, sorted(snap.block_tables)
    width = max((len(snap.block_tables[s]) for s in seqs), default=1)
    pool_x, pool_gap = width * 1.3 + 1.6, 0.85
    row_gap = max(1.2, (snap.num_blocks - 1) * pool_gap / max(len(seqs) - 1, 1))
    stored, owner = {}, {}
    for row, seq in enumerate(seqs):
        y, color = -row * row_gap, _SEQ_COLORS[row % len(_SEQ_COLORS)]
        ax.text(-0.2, y + 0.3, f"seq {seq}\n{snap.num_tokens[seq]} tokens", ha="right", va="center", fontsize=8, color=color)
        for i, block in enumerate(snap.block_tables[seq]):
            filled = min(bs, snap.num_tokens[seq] - i * bs)
            stored[block], owner[block] = max(stored.get(block, 0), filled), row
            shared = snap.ref_cnt.get(block, 0) > 1
            _draw_block(ax, i * 1.3, y, filled, bs, _SHARED if shared else color, f"→ {block}", "//" if shared else None)
            ax.annotate("", xy=(pool_x - 0.05, -block * pool_gap + 0.3), xytext=(i * 1.3 + 1, y + 0.3),
                        arrowprops=dict(arrowstyle="->", color=color, lw=0.7, alpha=0.6))
    for block in range(snap.num_blocks):
        ref = snap.ref_cnt.get(block, 0)
        color = _SHARED if ref > 1 else _SEQ_COLORS[owner[block] % len(_SEQ_COLORS)] if ref else "white"
        _draw_block(ax, pool_x, -block * pool_gap, stored.get(block, 0), bs, color, "", "//" if ref > 1 else None)
        ax.text(pool_x + 1.1, -block * pool_gap + 0.3, f"{block}  (ref {ref})" if ref else f"{block}  free", va="center", fontsize=7)
    ax.text(width * 0.65, 1.1, "block tables", ha="center", fontsize=8, style="italic")
    ax.text(pool_x + 0.5, 1.1, "physical blocks", ha="center", fontsize=8, style="italic")
    ax.set_xlim(-1.6, pool_x + 2.6)
    ax.set_ylim(min(-(len(seqs) - 1) * row_gap, -(snap.num_blocks - 1) * pool_gap) - 0.3, 1.4)
    ax.axis("off")


def draw_memory_waste(schemes: dict[str, tuple[float, float]], unit: str = "MiB"):
    """Chapter 3: stacked bars of memory holding tokens vs reserved but empty, one bar per scheme.

    ``schemes``: name -> (used, wasted) in ``unit``.
    """
    fig, ax = axes("KV memory: holding tokens vs reserved but empty", "", unit, size=(5.6, 3.6))
    names = list(schemes)
    used = [schemes[n][0] for n in names]
    wasted = [schemes[n][1] for n in names]
    ax.bar(names, used, color="#4c72b0", label="holds real tokens")
    ax.bar(names, wasted, bottom=used, color="#c44e52", alpha=0.75, label="reserved, empty")
    for i, (u, w) in enumerate(zip(used, wasted)):
        ax.text(i, u + w, f"{100 * w / (u + w):.1f}% wasted", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(u + w for u, w in zip(used, wasted)) * 1.15)
    ax.legend(loc="upper right", fontsize=8)
    return fig


def draw_kernel_overhead(rows, paper_range=(1.20, 1.26)):
    """Chapter 3: paged / contiguous decode-attention time against block size, one line per length,
    with the vLLM paper's kernel overhead range shaded. ``rows``: dicts with length, block_size, ratio."""
    fig, ax = axes("Paged attention kernel: time relative to contiguous", "block size (tokens)",
                   "paged / contiguous time", logx=True, size=(8.4, 3.8))
    for length in sorted({r["length"] for r in rows}):
        points = sorted((r["block_size"], r["ratio"]) for r in rows if r["length"] == length)
        ax.plot(*zip(*points), marker="o", label=f"{length} tokens")
    ax.axhspan(*paper_range, color="#dd8452", alpha=0.3, label="vLLM kernel vs FasterTransformer (paper)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    sizes = sorted({r["block_size"] for r in rows})
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_ylim(0, None)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


# --------------------------------------------------------------------------- chapter 4: serving under a memory budget

_POLICY_COLORS = {"max": "#c44e52", "pow2": "#dd8452", "oracle": "#8172b2", "paged": "#4c72b0"}
_CATEGORY_COLORS = {"tokens": "#4c72b0", "reserved": "#8da0cb", "internal": "#dd8452", "external": "#c44e52", "free": "#e0e0e0"}


def draw_length_histograms(samples: dict, targets: dict):
    """Chapter 4: prompt and output lengths of each trace (log-spaced bins), the paper's means as dashed lines.

    ``samples``: trace name -> (prompt lengths, output lengths); ``targets``: name -> (mean prompt, mean output).
    """
    import numpy as np

    fig, axs = plt.subplots(len(samples), 2, figsize=(8.4, 2.6 * len(samples)), layout="constrained", squeeze=False)
    for row, (name, lengths) in enumerate(samples.items()):
        for col, (values, target, what) in enumerate(zip(lengths, targets[name], ("prompt", "output"))):
            ax = axs[row, col]
            ax.hist(values, bins=np.geomspace(1, 2048, 40), color="#4c72b0", alpha=0.8)
            ax.axvline(target, color="black", linestyle="--", label=f"paper's mean {target:.2f}")
            ax.axvline(np.mean(values), color="#dd8452", label=f"sample mean {np.mean(values):.1f}")
            ax.set_xscale("log")
            ax.set_title(f"{name}: {what} tokens", fontsize=9)
            ax.set_xlabel("tokens (log scale)", fontsize=8)
            ax.set_ylabel("requests", fontsize=8)
            ax.legend(fontsize=7)
            ax.grid(True, alpha=0.3)
    return fig


def draw_memory_breakdown(rows: list[dict], paper: dict):
    """Chapter 4: where the KV budget goes under each policy (stacked %), the paper's token share as a marker.

    ``rows``: dicts with "policy" and "<category> (%)" for tokens, reserved, internal, external, free.
    """
    fig, ax = axes("KV budget while requests wait", "", "share of the budget (%)", size=(6.8, 3.8))
    names = [r["policy"] for r in rows]
    bottom = [0.0] * len(rows)
    labels = {"tokens": "holds tokens", "reserved": "reserved for future tokens", "internal": "internal fragmentation",
              "external": "external fragmentation", "free": "free"}
    for category, color in _CATEGORY_COLORS.items():
        values = [r[f"{category} (%)"] for r in rows]
        ax.bar(names, values, bottom=bottom, color=color, label=labels[category], edgecolor="white", linewidth=0.5)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.scatter(names, [100 * paper[n] for n in names], marker="D", color="black", zorder=3, label="paper: holds tokens")
    for i, r in enumerate(rows):
        ax.text(i, r["tokens (%)"] / 2, f"{r['tokens (%)']:.1f}%", ha="center", va="center", color="white", fontsize=8)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def draw_latency_curves(rows: list[dict]):
    """Chapter 4: normalised latency (s per output token) against request rate, one panel per trace."""
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    fig, axs = plt.subplots(1, len(traces), figsize=(4.4 * len(traces), 3.6), layout="constrained", squeeze=False)
    for ax, trace in zip(axs[0], traces):
        for policy, color in _POLICY_COLORS.items():
            points = sorted((r["rate"], r["s per token"]) for r in rows if r["trace"] == trace and r["policy"] == policy)
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, color=color, label=policy)
        ax.set_yscale("log")
        ax.set_title(trace, fontsize=9)
        ax.set_xlabel("request rate (requests/s)")
        ax.set_ylabel("normalised latency (s / token)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def draw_regime_curve(rows: list[dict], marks: dict, paper: dict):
    """Chapter 4: throughput of paged over each reservation policy against the fixed share of a decode step.

    ``rows``: dicts with "fixed share" and "paged / <policy>"; ``marks``: label -> (share, {policy: ratio});
    ``paper``: policy -> (low, high) range of the paper's ratio, drawn as bands.
    """
    fig, ax = axes("How much of the bigger batch becomes throughput", "fixed share of a decode step",
                   "throughput: paged / policy", size=(7.4, 4.0))
    shares = [r["fixed share"] for r in rows]
    for policy in ("max", "pow2", "oracle"):
        color = _POLICY_COLORS[policy]
        ax.plot(shares, [r[f"paged / {policy}"] for r in rows], color=color, label=f"paged / {policy}")
        if policy in paper:
            ax.axhspan(*paper[policy], color=color, alpha=0.12, label=f"paper: vLLM / Orca-{policy.capitalize()}")
    for (label, (share, values)), marker in zip(marks.items(), ("o", "s", "^")):
        for policy in ("max", "pow2", "oracle"):
            ax.scatter([share], [values[policy]], marker=marker, color=_POLICY_COLORS[policy], edgecolor="black", zorder=3)
        ax.scatter([], [], marker=marker, color="white", edgecolor="black", label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(0, 1.02)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig
