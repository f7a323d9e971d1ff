"""Attention kernels over a paged KV cache: the PyTorch reference and the fused decode kernels
(chapter 2's roofline of decode attention, chapter 3's cost of paging), and the few-row
matrix products of the lean decode step (chapter 1).

- ``dispatch``: :func:`decode_attention`, the one entry point (one new token per sequence):
  input checks, the kernel of the device (:func:`default_kernel`), split-K
  (:func:`work_items`, :func:`choose_num_splits`), the contiguous baseline (:func:`contiguous_tables`,
  :func:`as_blocks`) and :func:`kernel_info`.
- ``numba_decode``: the CPU kernel in numba: one work item per sequence (or split of it)
  walking its blocks in place through the block table, in the order of their memory, each
  K/V row once for its whole query group, online softmax, split-K with a log-sum-exp merge.
- ``numba_lanes``: its loops for groups of 8 or more query heads per KV head, the heads in
  the vector lanes (GQA-4 and MQA of chapter 2).
- ``numba_simd``: eight float32 lanes as one numba value, and their instructions (explicit SIMD).
- ``numba_ops``: scalar building blocks: float16/bfloat16 bits to float32, the softmax's
  exponential, the prefetch of the next block, a tensor's memory by address.
- ``numba_setup``: how the numba code is cached (under a fingerprint of all these sources)
  and on how many threads it runs (torch's).
- ``pool_decoder``: :class:`~kvlib.kernels.pool_decoder.PoolDecoder`, the numba kernel bound to
  one cache's pools (numpy views made once; only the shape checks below): the caches' decode
  steps on a CPU, allocating nothing (chapter 1's lean step).
- ``shape_checks``: the one copy of the shape checks every path makes (q's heads and head_dim
  against the cache's, q's batch against the block tables, a cache step's layer, q, k and v):
  a compiled kernel given a mismatched query would return NaN, wrong numbers or crash.
- ``row_product``: :func:`row_product`, ``add + x @ w`` for the few rows of a decode step (the
  lean step's products): the numba loop where it applies, ``torch.mm`` everywhere else.
- ``numba_row_product``: that numba loop, streaming the weights at the memory's rate.
- ``triton_decode``: the same contract on CUDA, in Triton (imported only where Triton is).
- ``torch_gather``: the readable reference and test oracle: gather each sequence's blocks
  through its block table into one contiguous copy, then attend (:func:`paged_attention`);
  prefills of several tokens per sequence run on it.

The numba modules and ``triton_decode`` are imported on first use, so ``import kvlib.kernels``
costs neither numba's nor Triton's import.
"""
