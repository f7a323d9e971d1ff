"""Every figure of the book, one ``draw_*`` function per figure, grouped by chapter (1 to 5, 7 and 8).

This package is the only part of kvlib that imports matplotlib: the experiments return
numbers and tables, and the notebooks (and tests) pass them here to be drawn. Each
function returns its :class:`matplotlib.figure.Figure`.

- ``common``: :func:`axes`, the labelled axes every single-panel figure starts from.
- ``cache``: chapter 1 (the article's cached loop, growth with length, step latency, the
  concatenation trap, the encoder-decoder's two caches).
- ``sizing``: chapter 2 (the catalog's cache sizes, max batch on one GPU, decode attention's
  time and roofline).
- ``paged``: chapter 3 (block tables and the pool, memory wasted, the paged kernel's overhead).
- ``serving``: chapter 4 (trace lengths, where the KV budget goes, regimes).
- ``latency``: chapter 4 (latency against request rate with each policy's sustained rate, TTFT and
  TPOT percentiles).
- ``levers``: chapter 5 (the lever chain relative to the baseline).
- ``quality``: chapter 7 (perplexity and probe recall against KV bytes per token, every lossy
  lever on one plot, with the Pareto front).
- ``engines``: chapter 8 (chunked prefill's TTFT and inter-token gap against the token budget,
  swapping against recomputation).
"""

from kvlib.plotting.cache import (
    draw_concat_trap,
    draw_encdec_cache_bytes,
    draw_growth,
    draw_step_latency,
    draw_step_profile,
)
from kvlib.plotting.common import axes
from kvlib.plotting.engines import draw_break_even, draw_chunked_tradeoff
from kvlib.plotting.latency import draw_latency_percentiles, draw_rate_curves
from kvlib.plotting.levers import draw_chain
from kvlib.plotting.paged import draw_block_tables, draw_kernel_overhead, draw_memory_waste
from kvlib.plotting.quality import draw_pareto, draw_recall
from kvlib.plotting.serving import (
    draw_length_histograms,
    draw_memory_breakdown,
    draw_regime_curve,
)
from kvlib.plotting.sizing import draw_catalog, draw_decode_times, draw_max_batch, draw_roofline

__all__ = [
    "draw_rate_curves",
    "draw_latency_percentiles",
    "draw_chunked_tradeoff",
    "draw_break_even",
    "axes",
    "draw_block_tables",
    "draw_catalog",
    "draw_chain",
    "draw_concat_trap",
    "draw_decode_times",
    "draw_encdec_cache_bytes",
    "draw_growth",
    "draw_kernel_overhead",
    "draw_length_histograms",
    "draw_max_batch",
    "draw_memory_breakdown",
    "draw_memory_waste",
    "draw_pareto",
    "draw_recall",
    "draw_regime_curve",
    "draw_roofline",
    "draw_step_latency",
    "draw_step_profile",
]
