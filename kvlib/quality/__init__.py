"""What a smaller cache costs: the trained model read through every lossy lever (chapter 7).

- ``score``: :class:`Quality` (perplexity, probe recall, greedy agreement) of a model's logits
  on the corpus's documents, and :func:`logits_in_steps`, which feeds a cache step by step.

Each lever at one setting, the sweep and its Pareto front are chapter 7's own code
(:mod:`kvlib.chapters.ch07_quality`).

Above :mod:`kvlib.cache` (whose quantized and evicting caches it runs) and :mod:`kvlib.train`
(whose model and documents it reads).
"""
