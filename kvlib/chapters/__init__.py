"""The chapters' own code: what each chapter measures, simulates and models, apart from the library.

The library (every other package of kvlib) holds the concepts: a cache, a block manager, a
scheduler, a size formula. A chapter's package holds what the chapter does with them: its
experiments, its ``bench`` section of ``python -m kvlib bench``, the data of its figures (drawn by
:mod:`kvlib.plotting`) and its exercises. "Where is chapter 4?" has one answer,
``kvlib/chapters/ch04_serving/``. Chapters import the library; nothing in the library imports a
chapter.

- ``ch00_measurements``: chapter 0's exercises.
- ``ch01_no_cache``: the article's experiment, the lockstep race, the race against
  ``transformers``, the concatenation trap, the cost model, the lean step's roofline.
- ``ch02_cache_size``: the size formula against real caches; decode attention's speed and its
  roofline for each number of KV heads.
- ``ch03_paged_attention``: the paged kernel's cost, the memory reservation wastes, the block
  manager the reader writes.
- ``ch04_serving``: the placement policies compared, the rate each sustains at equal latency,
  what sharing blocks saves, the preemption policy the reader writes.
- ``ch05_levers``: the lever chain on one model, its budgets and its simulated serving.
- ``ch06_troubleshooting``: the article's four symptoms, each reproduced and fixed.
- ``ch07_quality``: each lever at one setting, the sweep and its Pareto front, the recall an
  eviction policy allows, what the trained model does inside.
- ``ch08_serving_engines``: chunked prefill, swapping against recomputation, speculative
  decoding's bench, prefix caching predicted and simulated, the cache over many GPUs, the vLLM
  flag map.
- ``ch09_mla_absorbed``: MLA decoded absorbed and expanded, priced per cached token on the roofline,
  timed on this machine; TP against data-parallel attention.
- ``ch10_window_allocator``: blocks freed out of sliding windows (tokens identical), capacity with
  and without freeing on Gemma-2, Gemma-3-like and Jamba shapes.
- ``ch11_radix_routing``: a radix prefix tree beside the hash prefix cache (hit rates at equal
  capacity, the engine model's tokens through the tree), and cache-aware routing across simulated
  replicas.
- ``ch12_offload_tier``: a returning conversation with and without the offload tier, priced over
  PCIe and NVLink-C2C; swap priced per block and per layer.
- ``tables``: :func:`~kvlib.chapters.tables.show_whole_tables`, each chapter's first call.
- ``exercises``: every chapter's exercises, and :func:`~kvlib.chapters.exercises.check`.
"""
