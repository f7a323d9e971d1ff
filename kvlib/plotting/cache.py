"""Chapter 1's figures: the article's cached loop, growth with length, step latency, the
concatenation trap and the encoder-decoder's two caches.

Each function draws one figure of ``book/01_no_cache.ipynb`` from the results of an
experiment of :mod:`kvlib.cache` (:mod:`kvlib.chapters.ch01_no_cache.article`,
:mod:`kvlib.chapters.ch01_no_cache.nocache_race`,
:mod:`kvlib.chapters.ch01_no_cache.concat_trap`, :mod:`kvlib.cache.generation`) and returns the figure.
"""

from __future__ import annotations

import numpy as np

from kvlib.cache.generation import EncDecGeneration
from kvlib.chapters.ch01_no_cache.article import cached_working_set, llc_crossing
from kvlib.chapters.ch01_no_cache.concat_trap import TrapPoint
from kvlib.chapters.ch01_no_cache.nocache_race import Race
from kvlib.plotting.common import axes


def draw_step_profile(seconds: np.ndarray, llc: int, d_model: int = 256, num_layers: int = 4):
    """Microseconds of each cached step against the cache length, with the step's working set
    (right axis) and the last-level cache marked where the working set reaches it."""
    fig, ax = axes("The article's cached loop, step by step", "tokens in the cache", "microseconds per step")
    tokens = np.arange(1, len(seconds) + 1)
    ax.plot(
        tokens, np.asarray(seconds) * 1e6, lw=0.8, color="C0", label="time of the step (fastest of the runs)"
    )
    right = ax.twinx()
    mib = [cached_working_set(int(t), d_model, num_layers) / 2**20 for t in tokens]
    right.plot(tokens, mib, ls="--", color="C2", label="bytes the step touches (MiB)")
    right.set_ylabel("MiB the step touches")
    crossing = llc_crossing(llc, d_model, num_layers)
    if crossing <= len(seconds):
        ax.axvline(
            crossing, color="grey", ls=":", label=f"working set passes the LLC ({llc / 2**20:.0f} MiB)"
        )
    lines = ax.get_legend_handles_labels()
    extra = right.get_legend_handles_labels()
    ax.legend(lines[0] + extra[0], lines[1] + extra[1], loc="upper left", fontsize=8)
    return fig


def draw_growth(lengths, totals: dict, exponents: dict):
    """Total generation time against length on log-log axes, one line per way, with fitted slopes."""
    fig, ax = axes(
        "Total time grows like length^k", "generated tokens", "seconds in total", logx=True, logy=True
    )
    for (name, values), color in zip(totals.items(), ("C3", "C0", "C1"), strict=False):
        ax.plot(lengths, values, "o-", color=color, label=f"{name}: k = {exponents[name]:.2f}")
    ax.legend()
    return fig


def draw_step_latency(result: Race, long_cache: Race | None = None, pass_lengths=(), pass_s=()):
    """Seconds per generated token against its position: no cache (steps, then timed passes) and cache."""
    fig, ax = axes(
        "Time of each generation step", "position of the generated token", "seconds per step", logy=True
    )
    steps = np.arange(1, result.num_new + 1)
    ax.plot(steps, result.step_s["none"], lw=0.8, color="C3", label="no cache (every step)")
    if len(pass_lengths):
        ax.plot(pass_lengths, pass_s, "o", ms=4, color="C3", label="no cache (timed passes)")
    cached = long_cache.step_s["cache"] if long_cache is not None else result.step_s["cache"]
    ax.plot(np.arange(1, len(cached) + 1), cached, lw=0.8, color="C0", label="preallocated cache")
    ax.legend()
    return fig


def draw_concat_trap(points: list[TrapPoint], decode_step_s: float | None = None):
    """Cache work per decode step against cache length, both ways (log-log), beside a whole decode step."""
    fig, ax = axes(
        "Growing the cache by concatenation",
        "tokens in the cache",
        "seconds per step (cache work)",
        logx=True,
        logy=True,
    )
    lengths = [p.length for p in points]
    ax.plot(
        lengths,
        [p.preallocated.median_s for p in points],
        "o-",
        color="C0",
        label="preallocated, written in place",
    )
    ax.plot(lengths, [p.concat.median_s for p in points], "o-", color="C1", label="grown by torch.cat")
    if decode_step_s is not None:
        ax.axhline(decode_step_s, color="grey", ls=":", label="a whole cached decode step (short cache)")
    ax.legend()
    return fig


def draw_encdec_cache_bytes(run: EncDecGeneration):
    """Bytes held by the self-attention and the cross-attention cache after each generated token."""
    fig, ax = axes("Which cache grows", "generated tokens", "KiB held", size=(6.4, 3.2))
    steps = range(1, len(run.self_cache_bytes) + 1)
    ax.plot(steps, [b / 1024 for b in run.self_cache_bytes], color="C0", label="self-attention K/V")
    ax.plot(steps, [b / 1024 for b in run.cross_cache_bytes], color="C2", label="cross-attention K/V")
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig
