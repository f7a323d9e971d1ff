"""Chapter 12's figures (an offload tier, and swapping priced as engines copy): a returning
conversation's TTFT over each link against recomputation, and what copying block by block leaves of
a link's bandwidth."""

from __future__ import annotations

from kvlib.plotting.common import axes


def draw_tier_ttft(curves: dict[str, tuple[list[int], list[float]]]):
    """TTFT of a returning conversation against its history's length, one line per way of getting the
    history's K/V back: ``curves`` maps a label to (history tokens, seconds); "recompute" is drawn solid
    and black, the tiers dashed."""
    fig, ax = axes(
        "A returning conversation's first token (modelled, OPT-13B on an A100)",
        "tokens of history (a new message of 128 follows)",
        "TTFT (ms)",
    )
    for label, (lengths, seconds) in curves.items():
        style = {"color": "black", "lw": 2} if label == "recompute" else {"ls": "--"}
        ax.plot(lengths, [1e3 * s for s in seconds], label=label, **style)
    ax.legend(fontsize=8)
    return fig


def draw_copy_bandwidth(rows: list[dict], link_gb_s: float):
    """Bandwidth a 2,048-token copy achieves against the block size, per-block and per-layer copy calls
    (the rows of :func:`kvlib.chapters.ch12_offload_tier.pricing.swap_rows`), the link's own marked."""
    fig, ax = axes(
        "Copying a request's K/V: calls per block or per layer (modelled)",
        "block size (tokens)",
        "achieved (GB/s)",
        logx=True,
    )
    sizes = [r["block_size"] for r in rows]
    for label, style in (("per block", "o-"), ("per layer", "s--")):
        ax.plot(sizes, [r[f"{label}: GB/s achieved"] for r in rows], style, label=f"one call {label}")
    ax.axhline(link_gb_s, color="grey", lw=0.8)
    ax.annotate("the link", (sizes[0], link_gb_s), xytext=(2, -10), textcoords="offset points", fontsize=8)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return fig
