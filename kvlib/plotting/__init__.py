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
