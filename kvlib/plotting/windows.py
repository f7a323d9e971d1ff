"""Chapter 10's figure ("Windows and hybrids in a paged allocator"): sequences a pool holds with and
without window freeing, and the blocks one sequence holds per group kind as it grows."""

from __future__ import annotations

import matplotlib.pyplot as plt


def draw_window_capacity(sweep: list[dict], trace: list[dict], trace_name: str):
    """Left: sequences that fit in the pool against their length, one colour per shape, blocks kept
    (dashed) and freed by the windows (solid); log scale, Jamba's 4 attention layers hold many more.
    Right: blocks one ``trace_name`` sequence holds per group kind ("full", "sliding", "state")
    against its length (rows of :func:`kvlib.chapters.ch10_window_allocator.capacity.held_trace`).

    ``sweep``: dicts with "shape", "context", "kept" and "freed" (``capacity_sweep``'s rows).
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.2, 3.6), layout="constrained")
    shapes = list(dict.fromkeys(r["shape"] for r in sweep))
    for shape, colour in zip(shapes, ("C0", "C1", "C2", "C3"), strict=False):
        mine = sorted((r for r in sweep if r["shape"] == shape), key=lambda r: r["context"])
        x = [r["context"] for r in mine]
        left.plot(x, [r["freed"] for r in mine], "o-", color=colour, label=f"{shape}, freed")
        left.plot(x, [r["kept"] for r in mine], "x--", color=colour, label=f"{shape}, kept")
    left.set_yscale("log")
    left.set_xlabel("tokens per sequence")
    left.set_ylabel("sequences in the pool (log scale)")
    left.set_title("capacity of one pool", fontsize=9)
    kinds = [k for k in ("full", "sliding", "state") if any(k in r for r in trace)]
    x = [r["length"] for r in trace]
    for kind, style in zip(kinds, ("s-", "o-", "^-"), strict=False):
        right.plot(x, [r.get(kind, 0) for r in trace], style, label=f"{kind} groups")
    right.set_xlabel("tokens in the sequence")
    right.set_ylabel("blocks held")
    right.set_title(f"one {trace_name} sequence, windows freeing", fontsize=9)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig
