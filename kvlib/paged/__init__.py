"""PagedAttention: the KV cache in fixed-size blocks (chapter 3; chapter 4's engine runs on it).

- ``block_pool``: the blocks themselves (:class:`KVCacheBlock`), their reference counts, the
  free queue in LRU order and the prefix cache of full blocks by hash.
- ``block_manager``: each sequence's block table, copy-on-write and prefix hashing, and the
  rollback of speculative tokens (chapter 8); the caller owns each sequence's token list,
  which the manager only reads (its sequence-id and token-id checks are in :mod:`kvlib.checks`).
- ``usage``: what the blocks hold at a moment: statistics (:func:`block_usage`) and
  snapshots for the figures (:func:`block_snapshot`).
- ``paged_cache``: :class:`PagedKVCache`, the cache the model writes to and reads from, and
  the :class:`AttentionMetadata` of one forward pass; its attention kernels are in
  :mod:`kvlib.kernels`.
- ``step_inputs``: :class:`StepInputs`, a pass's token ids, positions, slots, block tables
  and lengths (and its logits) in buffers kept from step to step, so that a decode step
  allocates no tensor.
- ``decode_loop``: the paged decode loop (:func:`prefill`, :func:`decode_step`,
  :func:`greedy_step`), and generation of one batch of prompts or of branches sharing a prompt.
- ``hybrid_manager``: block tables per layer group over one pool: sliding windows give back the
  blocks no later query sees, Mamba-like groups hold a fixed state (chapter 10).
- ``window_cache``: a paged cache with sliding-window layers for the small model, groups of equal
  size sharing storage (chapter 10).
- ``offload_tier``: a CPU tier and a disk tier under the prefix cache, keyed by block hash: blocks
  saved on eviction and loaded back on a prefix hit that missed the pool (chapter 12).
- ``radix_tree``: SGLang's radix tree of cached token sequences (match, insert, locks, LRU eviction
  of unlocked leaves); ``radix_cache``: a block manager whose prefix cache is that tree (chapter 11).
"""
