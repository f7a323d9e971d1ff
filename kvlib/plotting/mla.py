"""Chapter 9's figure ("MLA in depth"): MLA's two decode forms on a GPU's roofline."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np


def draw_mla_roofline(rows: list[dict], peak_flops: float, bandwidth: float, gpu_name: str):
    """Attainable FLOP/s against FLOPs per byte (log-log): the roof min(peak, bandwidth x intensity),
    its ridge dashed, and one point per row (``roofline_table``'s rows: "shape", "form", "FLOPs / byte")
    at the height the roof allows it."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    ridge = peak_flops / bandwidth
    x = np.logspace(-1, 4, 200)
    ax.plot(x, np.minimum(peak_flops, bandwidth * x), "k-", label=f"{gpu_name} roof")
    ax.axvline(ridge, color="grey", ls="--", lw=0.8, label="ridge point")
    markers = {"absorbed": "o", "expanded": "x"}
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    for row in rows:
        colour = f"C{shapes.index(row['shape'])}"
        intensity = row["FLOPs / byte"]
        ax.plot(
            [intensity],
            [min(peak_flops, bandwidth * intensity)],
            markers[row["form"]],
            color=colour,
            ms=8,
            label=f"{row['shape']}, {row['form']}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOPs per byte of cache read (log scale)")
    ax.set_ylabel("attainable FLOP/s (log scale)")
    ax.set_title("MLA decode attention on the roofline (modelled)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig
