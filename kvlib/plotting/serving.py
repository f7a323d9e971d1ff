"""Chapter 4's figures: the traces' lengths, where the KV budget goes under each policy,
latency against request rate, and paged's throughput gain against the step-time regime.

Each function draws one figure of ``book/04_serving.ipynb`` from the tables of
:mod:`kvlib.chapters.ch04_serving.policy_comparison` and :mod:`kvlib.serving.traces`; the policies keep
the same colour in every figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from kvlib.plotting.common import axes

_POLICY_COLORS = {"max": "#c44e52", "pow2": "#dd8452", "oracle": "#8172b2", "paged": "#4c72b0"}


_CATEGORY_COLORS = {
    "tokens": "#4c72b0",
    "reserved": "#8da0cb",
    "internal": "#dd8452",
    "external": "#c44e52",
    "free": "#e0e0e0",
}


def draw_length_histograms(samples: dict, targets: dict):
    """Chapter 4: prompt and output lengths of each trace (log-spaced bins), the paper's means dashed.

    ``samples``: trace name -> (prompt lengths, output lengths);
    ``targets``: trace name -> (mean prompt, mean output).
    """
    fig, axs = plt.subplots(
        len(samples), 2, figsize=(8.4, 2.6 * len(samples)), layout="constrained", squeeze=False
    )
    for row, (name, lengths) in enumerate(samples.items()):
        for col, (values, target, what) in enumerate(
            zip(lengths, targets[name], ("prompt", "output"), strict=True)
        ):
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
    labels = {
        "tokens": "holds tokens",
        "reserved": "reserved for future tokens",
        "internal": "internal fragmentation",
        "external": "external fragmentation",
        "free": "free",
    }
    for category, color in _CATEGORY_COLORS.items():
        values = [r[f"{category} (%)"] for r in rows]
        ax.bar(
            names,
            values,
            bottom=bottom,
            color=color,
            label=labels[category],
            edgecolor="white",
            linewidth=0.5,
        )
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.scatter(
        names,
        [100 * paper[n] for n in names],
        marker="D",
        color="black",
        zorder=3,
        label="paper: holds tokens",
    )
    for i, r in enumerate(rows):
        ax.text(
            i,
            r["tokens (%)"] / 2,
            f"{r['tokens (%)']:.1f}%",
            ha="center",
            va="center",
            color="white",
            fontsize=8,
        )
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def draw_regime_curve(rows: list[dict], marks: dict, paper: dict):
    """Chapter 4: throughput of paged over each reservation policy against the fixed share of a decode step.

    ``rows``: dicts with "fixed share" and "paged / <policy>"; ``marks``: label -> (share, {policy: ratio});
    ``paper``: policy -> (low, high) range of the paper's ratio, drawn as bands.
    """
    fig, ax = axes(
        "How much of the bigger batch becomes throughput",
        "fixed share of a decode step",
        "throughput: paged / policy",
        size=(7.4, 4.0),
    )
    shares = [r["fixed share"] for r in rows]
    for policy in ("max", "pow2", "oracle"):
        color = _POLICY_COLORS[policy]
        ax.plot(shares, [r[f"paged / {policy}"] for r in rows], color=color, label=f"paged / {policy}")
        if policy in paper:
            ax.axhspan(
                *paper[policy], color=color, alpha=0.12, label=f"paper: vLLM / Orca-{policy.capitalize()}"
            )
    for (label, (share, values)), marker in zip(marks.items(), ("o", "s", "^"), strict=False):
        for policy in ("max", "pow2", "oracle"):
            ax.scatter(
                [share],
                [values[policy]],
                marker=marker,
                color=_POLICY_COLORS[policy],
                edgecolor="black",
                zorder=3,
            )
        ax.scatter([], [], marker=marker, color="white", edgecolor="black", label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(0, 1.02)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig
