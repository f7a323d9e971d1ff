"""Chapter 3's figures: block tables pointing into the pool of physical blocks, the memory
each scheme wastes, and the paged kernel's overhead against the block size.

:func:`draw_block_tables` draws :class:`kvlib.paged.BlockSnapshot` objects (one panel each):
every sequence's logical blocks on the left, arrows to the physical blocks on the right,
shared blocks (ref_cnt > 1) orange and hatched.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from kvlib.plotting.common import axes

_SEQ_COLORS = ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#937860", "#64b5cd")


_SHARED = "#dd8452"


def _draw_block(ax, x: float, y: float, filled: int, block_size: int, color: str, label: str, hatch=None):
    """One block as ``block_size`` cells, the first ``filled`` coloured; its label above."""
    for i in range(block_size):
        face = color if i < filled else "white"
        ax.add_patch(
            plt.Rectangle(
                (x + i / block_size, y),
                1 / block_size,
                0.6,
                facecolor=face,
                edgecolor="black",
                linewidth=0.6,
                hatch=hatch if i < filled else None,
            )
        )
    ax.text(x + 0.5, y + 0.68, label, ha="center", va="bottom", fontsize=7)


def draw_block_tables(snapshots, size=None):
    """Chapter 3: block tables (left: each sequence's logical blocks) pointing into the pool (right).

    ``snapshots``: a list of (title, :class:`kvlib.paged.BlockSnapshot`), drawn side by side.
    Filled cells are token slots in use; blocks shared by several sequences (ref_cnt > 1)
    are orange and hatched; each physical block is labelled with its id and ref_cnt.
    """
    fig, axs = plt.subplots(
        1, len(snapshots), figsize=size or (4.6 * len(snapshots), 3.8), layout="constrained"
    )
    for ax, (title, snap) in zip([axs] if len(snapshots) == 1 else axs, snapshots, strict=True):
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
        ax.text(
            -0.2,
            y + 0.3,
            f"seq {seq}\n{snap.num_tokens[seq]} tokens",
            ha="right",
            va="center",
            fontsize=8,
            color=color,
        )
        for i, block in enumerate(snap.block_tables[seq]):
            filled = min(bs, snap.num_tokens[seq] - i * bs)
            stored[block], owner[block] = max(stored.get(block, 0), filled), row
            shared = snap.ref_cnt.get(block, 0) > 1
            _draw_block(
                ax,
                i * 1.3,
                y,
                filled,
                bs,
                _SHARED if shared else color,
                f"→ {block}",
                "//" if shared else None,
            )
            ax.annotate(
                "",
                xy=(pool_x - 0.05, -block * pool_gap + 0.3),
                xytext=(i * 1.3 + 1, y + 0.3),
                arrowprops=dict(arrowstyle="->", color=color, lw=0.7, alpha=0.6),
            )
    for block in range(snap.num_blocks):
        ref = snap.ref_cnt.get(block, 0)
        color = _SHARED if ref > 1 else _SEQ_COLORS[owner[block] % len(_SEQ_COLORS)] if ref else "white"
        _draw_block(
            ax, pool_x, -block * pool_gap, stored.get(block, 0), bs, color, "", "//" if ref > 1 else None
        )
        ax.text(
            pool_x + 1.1,
            -block * pool_gap + 0.3,
            f"{block}  (ref {ref})" if ref else f"{block}  free",
            va="center",
            fontsize=7,
        )
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
    for i, (u, w) in enumerate(zip(used, wasted, strict=True)):
        ax.text(i, u + w, f"{100 * w / (u + w):.1f}% wasted", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(u + w for u, w in zip(used, wasted, strict=True)) * 1.15)
    ax.legend(loc="upper right", fontsize=8)
    return fig


def draw_kernel_overhead(
    rows, paper_range=(1.20, 1.26), title: str = "Paged attention kernel: time relative to contiguous"
):
    """Chapter 3: paged / contiguous decode-attention time against block size, one line per length,
    with the vLLM paper's kernel overhead range shaded. ``rows``: dicts with length, block_size, ratio
    (the gather kernel's rows, or the fused kernel's, named by ``title``)."""
    fig, ax = axes(
        title,
        "block size (tokens)",
        "paged / contiguous time",
        logx=True,
        size=(8.4, 3.8),
    )
    for length in sorted({r["length"] for r in rows}):
        points = sorted((r["block_size"], r["ratio"]) for r in rows if r["length"] == length)
        ax.plot(*zip(*points, strict=True), marker="o", label=f"{length} tokens")
    ax.axhspan(*paper_range, color="#dd8452", alpha=0.3, label="vLLM kernel vs FasterTransformer (paper)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    sizes = sorted({r["block_size"] for r in rows})
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_ylim(0, None)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig
