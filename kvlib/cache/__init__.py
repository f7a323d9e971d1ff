"""The contiguous KV cache and the caches that shrink it (chapters 1, 2 and 7; reused in 3 and 6).

- ``contiguous``: the preallocated cache and the concatenating one (the trap), with their byte
  counts: the readable caches the book shows.
- ``fast_contiguous``: the preallocated cache tuned for speed (a decode step allocates nothing;
  the numba kernel on a CPU), which the benchmarks and the lean model choose.
- ``quantized``: a cache that stores K/V in a :mod:`kvlib.quant` format and attends over them
  dequantized (chapter 7).
- ``eviction_policies``: which tokens a layer keeps under a budget: a sliding window,
  StreamingLLM's sinks plus a window, H2O's heavy hitters plus a recent window (chapter 7).
- ``evicting_cache``: a cache that applies such a policy after every step and attends over the
  kept tokens.
- ``generation``: greedy generation without a cache, with one and with concatenation (one
  :class:`Decoder` step at a time), and the encoder-decoder's generation.

Chapter 1's and 2's experiments with these caches are in :mod:`kvlib.chapters.ch01_no_cache` and
:mod:`kvlib.chapters.ch02_cache_size`.

The caches implement :class:`kvlib.model.config.KVCache`; the paged cache is in
:mod:`kvlib.paged.paged_cache`, one layer up.
"""
