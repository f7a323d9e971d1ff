"""The contiguous KV cache and what it buys (chapter 1; chapter 2's experiments; reused in 3 and 6).

- ``contiguous``: the preallocated cache and the concatenating one (the trap), with their byte
  counts.
- ``quantized``: a cache that stores K/V in a :mod:`kvlib.quant` format and attends over them
  dequantized (chapter 7).
- ``eviction``: which tokens a layer keeps under a budget: a sliding window, StreamingLLM's sinks
  plus a window, H2O's heavy hitters plus a recent window (the same chapter).
- ``evicting``: a cache that applies such a policy after every step and attends over the kept
  tokens.
- ``generation``: greedy generation without a cache, with one and with concatenation (one
  :class:`Decoder` step at a time), and the encoder-decoder's generation.
- ``costmodel``: FLOPs per step, the fitted time per FLOP, the growth exponent, and when the
  concatenation trap matters for real models.
- ``article``: the source article's NumPy experiment, reproduced.
- ``nocache_race``: chapter 1's lockstep race of no cache against a cache.
- ``concat_trap``: chapter 1's measurement of what concatenation copies.
- ``transformers_race``: our generation against ``transformers``' ``generate``.
- ``size_check``: the size formula of :mod:`kvlib.sizing.spec` against the bytes real caches hold
  (chapter 2).
- ``decode_speed``: chapter 2's decode attention for each number of KV heads on the roofline
  (chapter 6 reuses it).
- ``decode_roofline``: chapter 2's fused kernel (:mod:`kvlib.kernels`) against the DRAM and
  matmul probes at the same threads: roofline fractions, the ridge point, split-K.
- ``step_roofline``: one whole decode step of the model against its roofline bound (chapter 1).

The caches implement :class:`kvlib.model.config.KVCache`; the paged cache is in
:mod:`kvlib.paged.paged_cache`, one layer up.
"""
