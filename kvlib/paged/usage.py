"""What the blocks of a :class:`~kvlib.paged.block_manager.BlockManager` hold at one moment (chapters 3, 4).

The manager keeps block tables and nothing else; this module reads them from the outside:

- :func:`block_usage`: blocks used, free and cached, tokens per sequence and tokens actually
  stored (a shared block counts once), hence the internal fragmentation;
- :func:`stored_tokens`: the stored tokens alone (what chapter 4's paged memory reports when
  prefix caching shares blocks);
- :func:`block_snapshot`: a copy of the block tables and reference counts, which
  :func:`kvlib.plotting.draw_block_tables` draws and chapter 3 prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib.paged.block_manager import BlockManager


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
    block_tables: dict[int, list[int]]  # seq_id -> its block table
    num_tokens: dict[int, int]  # seq_id -> tokens with a slot
    ref_cnt: dict[int, int]  # block_id -> ref_cnt, for used blocks
    cached: frozenset[int]  # block ids registered in the prefix cache


def _stored_per_block(manager: BlockManager) -> dict[int, int]:
    """Tokens held by each used block (a shared block holds as many as its fullest user)."""
    size = manager.block_size
    stored: dict[int, int] = {}
    for seq in manager.sequences.values():
        for i, block_id in enumerate(seq.block_table):
            filled = min(size, seq.num_tokens - i * size)
            stored[block_id] = max(stored.get(block_id, 0), filled)
    return stored


def stored_tokens(manager: BlockManager) -> int:
    """Slots of used blocks that hold a token: a token stored in a shared block counts once."""
    return sum(_stored_per_block(manager).values())


def block_usage(manager: BlockManager) -> BlockUsage:
    """Blocks used, free and cached; tokens per sequence and tokens actually stored."""
    pool = manager.pool
    return BlockUsage(
        block_size=manager.block_size,
        num_blocks=manager.num_blocks,
        num_used_blocks=manager.num_blocks - manager.num_free_blocks,
        num_free_blocks=manager.num_free_blocks,
        num_cached_blocks=len(pool.cached),
        num_evictable_blocks=sum(1 for b in pool.cached.values() if b.ref_cnt == 0),
        num_sequences=len(manager.sequences),
        num_tokens=sum(s.num_tokens for s in manager.sequences.values()),
        num_stored_tokens=stored_tokens(manager),
    )


def block_snapshot(manager: BlockManager) -> BlockSnapshot:
    """Copy of the block tables and reference counts (for pictures and printed tables)."""
    return BlockSnapshot(
        block_size=manager.block_size,
        num_blocks=manager.num_blocks,
        block_tables={s: list(seq.block_table) for s, seq in manager.sequences.items()},
        num_tokens={s: seq.num_tokens for s, seq in manager.sequences.items()},
        ref_cnt={b.block_id: b.ref_cnt for b in manager.pool.blocks if b.ref_cnt > 0},
        cached=frozenset(b.block_id for b in manager.pool.cached.values()),
    )
