"""Chapter 2's figures: the catalog's cache sizes, the largest batch on one GPU, and decode
attention's time and roofline for several numbers of KV heads.

:func:`draw_catalog` and :func:`draw_max_batch` draw the sizing arithmetic of
:mod:`kvlib.sizing` (the static plot beside the calculator widget); :func:`draw_decode_times`
and :func:`draw_roofline` draw the measurements of :mod:`kvlib.chapters.ch02_cache_size.decode_speed`.
"""

from __future__ import annotations

import math

import torch
from matplotlib.patches import Patch

from kvlib.chapters.ch02_cache_size.decode_roofline import DecodeMeasurement
from kvlib.plotting.common import axes
from kvlib.sizing.catalog import catalog_entry, catalog_table
from kvlib.sizing.deployment import Deployment
from kvlib.sizing.dtypes import KVDtype, kv_dtype
from kvlib.sizing.widget import capacity_report


def draw_max_batch(
    models=("Llama-2-7B", "Llama-3-8B", "Mistral-7B-v0.1", "Gemma-2-9B", "Falcon-7B"),
    gpu_gib: float = 80.0,
    overhead_gib: float = 4.0,
    kv_dtype: str = "fp16",
):
    """Max batch against context on one GPU (bf16 weights): the static plot beside the calculator."""
    fig, ax = axes(
        f"Sequences that fit in {gpu_gib:g} GiB of GPU memory ({kv_dtype} cache, bf16 weights)",
        "context (tokens)",
        "max batch",
        logx=True,
        logy=True,
    )
    for name in models:
        limit = catalog_entry(name).spec.max_context
        contexts = [c for c in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768) if c <= limit]
        batches = [
            capacity_report(Deployment(name, c, 1, kv_dtype, gpu_gib, "bf16", overhead_gib))["max_batch"]
            for c in contexts
        ]
        ax.plot(contexts, batches, "o-", label=name)
    ax.legend(fontsize=8)
    return fig


def draw_catalog(dtype: str | KVDtype = "fp16"):
    """Cache of one sequence at each catalog model's maximum context (log scale), coloured by kind."""

    rows = catalog_table(dtype)[::-1]
    fig, ax = axes(
        f"KV cache of one sequence at the model's maximum context ({kv_dtype(dtype).name})",
        "GiB (log scale)",
        "",
        logx=True,
        size=(7.5, 4.6),
    )
    colours = {"MHA": "tab:red", "GQA": "tab:blue", "MQA": "tab:green", "MLA": "tab:purple"}
    ax.barh(
        [r["model"] for r in rows],
        [r["cache at max context (GiB)"] for r in rows],
        color=[colours[r["kind"]] for r in rows],
    )
    for i, r in enumerate(rows):
        ax.annotate(
            f" {r['cache at max context (GiB)']:g} GiB @ {r['max context']:,}",
            (r["cache at max context (GiB)"], i),
            va="center",
            fontsize=7,
        )
    ax.set_xlim(right=ax.get_xlim()[1] * 20)
    handles = [Patch(color=c, label=k) for k, c in colours.items()]
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    return fig


def draw_decode_times(measurements: list[DecodeMeasurement]):
    """Time of one decode step's attention against context, one line per number of KV heads."""
    fig, ax = axes(
        "One decode step's attention (one layer)", "context (tokens)", "time (ms)", logx=True, logy=True
    )
    for kv in sorted({m.num_kv_heads for m in measurements}, reverse=True):
        points = sorted((m for m in measurements if m.num_kv_heads == kv), key=lambda m: m.context)
        ax.plot(
            [m.context for m in points],
            [m.timing.median_s * 1e3 for m in points],
            "o-",
            label=f"{kv} KV heads",
        )
    ax.legend(fontsize=8)
    return fig


def draw_roofline(measurements: list[DecodeMeasurement], probe_gbps: float, peak_gflops: float):
    """Achieved GFLOP/s against FLOPs per byte, under the memory roof (probe) and the compute roof,
    with the ridge point (peak / bandwidth, where the roofs meet) marked."""
    fig, ax = axes(
        "Decode attention on a roofline",
        "arithmetic intensity (FLOPs per byte of K/V)",
        "achieved GFLOP/s",
        logx=True,
        logy=True,
    )
    ridge = peak_gflops / probe_gbps
    xs = [m.intensity for m in measurements] + [ridge]
    grid = torch.logspace(math.log10(min(xs) / 2), math.log10(max(xs) * 2), 50).tolist()
    ax.plot(
        grid,
        [min(probe_gbps * x, peak_gflops) for x in grid],
        "k-",
        lw=1,
        label=f"roof: {probe_gbps:.0f} GB/s probe, {peak_gflops:.0f} GFLOP/s matmul",
    )
    ax.axvline(ridge, color="gray", linestyle=":", lw=1, label=f"ridge point: {ridge:.1f} FLOP/byte")
    contexts = sorted({m.context for m in measurements})
    for context, marker in zip(contexts, "o^sDv", strict=False):
        points = [m for m in measurements if m.context == context]
        ax.scatter(
            [m.intensity for m in points],
            [m.gflops for m in points],
            marker=marker,
            label=f"context {context:,}",
        )
        for m in points:
            ax.annotate(
                f"{m.num_kv_heads}",
                (m.intensity, m.gflops),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=7,
            )
    ax.legend(fontsize=8, title="point labels: KV heads", title_fontsize=8)
    return fig
