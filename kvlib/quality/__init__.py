"""What a smaller cache costs: the trained model read through every lossy lever (chapter 7).

- ``score``: :class:`Quality` (perplexity, probe recall, greedy agreement) of a model's logits
  on the corpus's documents, and :func:`logits_in_steps`, which feeds a cache step by step.
- ``compare``: one lever at one setting (quantized K/V, fewer K/V heads, eviction) as a
  :class:`LeverResult` with its KV bytes per token.
- ``tradeoffs``: chapter 7's sweep, its table of ratios, the Pareto front, and ``bench``.

Above :mod:`kvlib.cache` (whose quantized and evicting caches it runs) and :mod:`kvlib.train`
(whose model and documents it reads).
"""
