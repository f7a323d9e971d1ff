"""PagedAttention: the KV cache in fixed-size blocks (chapter 3; chapter 4's engine runs on it).

- ``block_pool``: the blocks themselves (:class:`KVCacheBlock`), their reference counts, the
  free queue in LRU order and the prefix cache of full blocks by hash.
- ``block_manager``: each sequence's block table, copy-on-write and prefix hashing, and the
  rollback of speculative tokens (chapter 8); the caller owns each sequence's token list,
  which the manager only reads. ``block_arguments`` holds the checks of its arguments.
- ``usage``: what the blocks hold at a moment: statistics (:func:`block_usage`) and
  snapshots for the figures (:func:`block_snapshot`).
- ``paged_cache``: :class:`PagedKVCache`, the cache the model writes to and reads from, and
  the :class:`AttentionMetadata` of one forward pass; its attention kernels are in
  :mod:`kvlib.kernels`.
- ``step_inputs``: :class:`StepInputs`, a pass's token ids, positions, slots, block tables
  and lengths (and its logits) in buffers kept from step to step, so that a decode step
  allocates no tensor.
- ``generation``: the paged decode loop (:func:`prefill`, :func:`decode_step`,
  :func:`greedy_step`), and generation of one batch of prompts or of branches sharing a prompt.
- ``kernel_overhead``: chapter 3's measurements: equality with the contiguous cache and the
  paged kernel's cost.
- ``memory_waste``: memory lost by reserving the maximum length, against paging.
"""

from kvlib.paged.block_manager import Allocation, BlockManager, SequenceBlocks, num_blocks_for
from kvlib.paged.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock, hash_block_tokens
from kvlib.paged.generation import (
    BranchRun,
    PagedGeneration,
    decode_branches,
    decode_step,
    generate_paged,
    give_slots,
    greedy,
    greedy_step,
    prefill,
)
from kvlib.paged.kernel_overhead import (
    KERNEL_MIN_LONGEST,
    DecodeCase,
    KernelSizes,
    kernel_sizes,
    paged_vs_contiguous_error,
    random_decode_case,
    time_decode_attention,
    time_fused_overhead,
    timing_case,
    tokens_identical,
)
from kvlib.paged.memory_waste import ReservationWaste, reservation_waste
from kvlib.paged.paged_cache import AttentionMetadata, PagedKVCache
from kvlib.paged.step_inputs import StepInputs
from kvlib.paged.usage import BlockSnapshot, BlockUsage, block_snapshot, block_usage, stored_tokens

__all__ = [
    "Allocation",
    "AttentionMetadata",
    "BlockManager",
    "BlockPool",
    "BlockSnapshot",
    "BlockUsage",
    "BranchRun",
    "DecodeCase",
    "FreeBlockQueue",
    "KERNEL_MIN_LONGEST",
    "KVCacheBlock",
    "KernelSizes",
    "PagedGeneration",
    "PagedKVCache",
    "StepInputs",
    "ReservationWaste",
    "SequenceBlocks",
    "block_snapshot",
    "block_usage",
    "decode_branches",
    "decode_step",
    "generate_paged",
    "give_slots",
    "greedy",
    "greedy_step",
    "hash_block_tokens",
    "kernel_sizes",
    "num_blocks_for",
    "paged_vs_contiguous_error",
    "prefill",
    "random_decode_case",
    "reservation_waste",
    "stored_tokens",
    "time_decode_attention",
    "time_fused_overhead",
    "timing_case",
    "tokens_identical",
]
