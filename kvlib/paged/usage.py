"""Paged KV-cache bookkeeping: a block pool, per-sequence block tables, copy-on-write and prefix caching (chapter 3).

PagedAttention (Kwon et al. 2023, vLLM) stores a sequence's keys and values in fixed-size
*blocks* of ``block_size`` token slots that may lie anywhere in one preallocated pool, the
way an operating system maps a process's pages onto physical frames. A sequence's
``block_table`` lists the physical block of each of its logical blocks; token ``pos`` lives
in slot ``block_table[pos // block_size] * block_size + pos % block_size``.

This module is plain Python: it decides which block holds which token and never touches
a tensor. :class:`kvlib.paged_attention.PagedKVCache` owns the K/V storage and asks a
:class:`BlockManager` where to write; chapter 4's serving engine uses the same manager to
schedule requests. The vocabulary follows vLLM: ``block_size``, ``num_blocks``,
``ref_cnt``, ``block_table``, ``block_hash``, slot mapping.

- A block is shared by every block table that points at it; ``ref_cnt`` counts them.
  A block with ``ref_cnt == 0`` waits in the free queue.
- ``fork`` lets a child sequence share all of its parent's blocks (parallel sampling,
  beam search). The first write into a shared block copies it (copy-on-write).
- Prefix caching: a FULL block gets a hash chained over the previous block's hash and its
  own token ids, so equal hashes mean equal prefixes. A new sequence reuses the cached
  blocks of its longest cached prefix. A freed cached block keeps its hash and can be reused
  until it is evicted, least recently freed first.
- Running out of blocks is normal: ``can_allocate`` / ``can_append`` answer first, and
  ``allocate`` / ``append_slot`` return ``None`` instead of failing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockUsage:
    """Block statistics of a manager at one moment (chapters 3 and 4)."""

    block_size: int
    num_blocks: int
    num_used_blocks: int  # ref_cnt > 0
    num_free_blocks: int  # ref_cnt == 0 (cached or not)
    num_cached_blocks: int  # registered in the prefix cache (used or free)
    num_evictable_blocks: int  # cached but unused: reusable by a prefix hit until evicted
    num_sequences: int
    num_tokens: int  # sum of sequence lengths (a shared token counts once per sequence)
    num_stored_tokens: int  # slots of used blocks that hold a token

    @property
    def internal_fragmentation(self) -> int:
        """Slots of used blocks that hold no token: the unfilled tails of last blocks."""
        return self.num_used_blocks * self.block_size - self.num_stored_tokens


@dataclass(frozen=True)
class BlockSnapshot:
    """Block tables and reference counts at one moment, for drawing (``kvlib.plotting.draw_block_tables``)."""

    block_size: int
    num_blocks: int
    block_tables: dict[int, list[int]]
    num_tokens: dict[int, int]
    ref_cnt: dict[int, int]  # block_id -> ref_cnt, for used blocks
    cached: frozenset[int]  # block ids registered in the prefix cache
