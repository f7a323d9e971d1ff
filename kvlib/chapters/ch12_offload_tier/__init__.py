"""An offload tier for the cache, and swapping priced as engines copy (chapter 12).

- ``returning``: a returning conversation served with and without the offload tier
  (:mod:`kvlib.paged.offload_tier`) on the engine's paged cache and steps, on this CPU: where its
  cached tokens come from, its tokens, and its TTFT measured.
- ``pricing``: the same TTFT priced for a GPU over PCIe 4.0, PCIe 5.0, NVLink-C2C and from an NVMe
  disk, against the book's A100 step model; swapping priced per block and per layer
  (:class:`kvlib.serving.swap.BlockCopyModel`) and its break-even with recomputation.
- ``copy_calls``: a request's blocks copied per block and per layer between two pools on this CPU,
  measured: what the calls cost.
- ``bench``: this chapter's bench section (``python -m kvlib bench --only offload``).
- ``exercises``: the chapter's exercises, their checks and reference solutions.
"""
