"""Chapter 8's figures ("Serving as engines do it now"): chunked prefill's trade-off and swapping
against recomputation."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from kvlib.plotting.common import axes


def draw_chunked_tradeoff(rows: list[dict]):
    """p99 time to first token and p99 inter-token latency (ITL) against the token budget of a step.

    ``rows``: dicts with "series" (a label: a step model and a request rate), "budget" ("off" or a
    number of tokens), "ttft_p99_s" and "itl_p99_s" (the rows of
    :func:`kvlib.chapters.ch08_serving_engines.chunked_prefill.chunked_prefill_sweep`, labelled); one
    line per series. "off" is drawn at the right, beyond the largest budget: a step then takes every prompt
    whole. TTFT is drawn on a log scale: past saturation it grows by orders of magnitude.
    """
    series = list(dict.fromkeys(r["series"] for r in rows))
    budgets = [b for b in dict.fromkeys(r["budget"] for r in rows) if b != "off"]
    positions = {b: i for i, b in enumerate([*budgets, "off"])}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.2, 3.6), layout="constrained")
    for name, style in zip(series, ("o-", "s-", "^--", "v:"), strict=False):
        mine = sorted((r for r in rows if r["series"] == name), key=lambda r: positions[r["budget"]])
        x = [positions[r["budget"]] for r in mine]
        left.plot(x, [r["ttft_p99_s"] for r in mine], style, label=name)
        right.plot(x, [1e3 * r["itl_p99_s"] for r in mine], style, label=name)
    left.set_yscale("log")
    for ax, title, ylabel in (
        (left, "time to first token", "TTFT p99 (s, log scale)"),
        (right, "gap between two tokens of a request", "ITL p99 (ms)"),
    ):
        ax.set_xticks(list(positions.values()), [str(b) for b in positions])
        ax.set_xlabel("tokens per step (--max-num-batched-tokens)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def draw_break_even(line, max_tokens: int = 256):
    """Seconds to resume a preempted request by recomputation and by swapping, against its length
    (a :class:`kvlib.chapters.ch08_serving_engines.swap_analysis.BreakEven`), the crossing marked."""
    lengths = np.arange(1, max_tokens + 1)
    fig, ax = axes(
        "Resuming a preempted request: recompute or swap back",
        "tokens of the request (prompt + generated)",
        "time to resume (ms)",
    )
    ax.plot(lengths, 1e3 * line.recompute_s(lengths), label="recompute (prefill again)")
    ax.plot(lengths, 1e3 * line.swap_s(lengths), "--", label="swap out and back in")
    crossing = line.crossing_tokens
    if 0 < crossing <= max_tokens:
        ax.axvline(crossing, color="grey", lw=0.8)
        ax.annotate(
            f"{crossing:.0f} tokens", (crossing, 0), xytext=(4, 6), textcoords="offset points", fontsize=8
        )
    ax.legend(fontsize=8)
    return fig
