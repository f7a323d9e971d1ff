"""The block pool behind a paged KV cache: blocks, ref_cnt, the free queue and the prefix cache (chapter 3).

Plain Python, no tensors: a block is just an id. :class:`BlockPool` hands out free
blocks, takes them back when no block table uses them any more, and remembers which
full blocks hold which prefix (by a chained hash) so that a later request can reuse
them. :class:`kvlib.paged.BlockManager` builds block tables on top of it.
"""

from __future__ import annotations

import hashlib
import operator
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.checks import is_int


@dataclass(eq=False)
class KVCacheBlock:
    """One physical block of the pool: its id, how many block tables use it, and its prefix-cache hash."""

    block_id: int
    ref_cnt: int = 0
    block_hash: str | None = None  # set while the block is registered in the prefix cache


def hash_block_tokens(parent_hash: str | None, token_ids: Sequence[int]) -> str:
    """Hash of a full block, chained over the previous block's hash and this block's token ids.

    Two blocks get the same hash only if the whole prefix up to and including them is
    equal, because the parent hash carries everything before. SHA-256 (shortened to 16 hex
    digits for printing) is stable across runs and machines, unlike Python's ``hash``.
    """
    try:
        text = f"{parent_hash}|{','.join(str(operator.index(t)) for t in token_ids)}"
    except TypeError:
        raise KVLibError(f"token ids must be integers, not {token_ids!r}"[:200]) from None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class FreeBlockQueue:
    """Blocks with ``ref_cnt == 0`` in the order they were freed: the front is reused (or evicted) first.

    An ``OrderedDict`` gives O(1) pop from the front, append at the back, and removal from
    the middle (when a prefix-cache hit revives a freed block).
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]):
        self._queue: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.block_id in self._queue

    def popleft(self) -> KVCacheBlock:
        """Take the block freed longest ago."""
        return self._queue.popitem(last=False)[1]

    def append(self, block: KVCacheBlock) -> None:
        """Put a just-freed block at the back."""
        self._queue[block.block_id] = block

    def remove(self, block: KVCacheBlock) -> None:
        """Take a block out of the middle (a prefix-cache hit revives it)."""
        del self._queue[block.block_id]

    def block_ids(self) -> list[int]:
        """The queued block ids, front first."""
        return list(self._queue)


# The most blocks a pool of Python objects holds: about 1 GB of them, and several times the largest
# pool a real GPU gets (Qwen2-0.5B, 12 KiB of cache per token, fills an H200 with ~640,000 blocks
# of 16). Beyond it, building the pool would take minutes and all memory instead of failing.
MAX_NUM_BLOCKS = 1 << 22


class BlockPool:
    """``num_blocks`` blocks, the free queue, and the prefix cache (block hash -> block)."""

    def __init__(self, num_blocks: int):
        if not is_int(num_blocks) or num_blocks < 1:
            raise KVLibError(f"num_blocks must be a positive integer, not {num_blocks!r}")
        if num_blocks > MAX_NUM_BLOCKS:
            raise KVLibError(
                f"num_blocks {num_blocks:,} exceeds the {MAX_NUM_BLOCKS:,} blocks a block pool holds "
                "(count blocks with a larger block_size, or without prefix caching)"
            )
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[str, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence uses (including cached ones that may still be revived)."""
        return len(self.free_queue)

    def get_new_blocks(self, num: int) -> list[KVCacheBlock]:
        """Take ``num`` blocks from the front of the free queue, evicting their cached hashes."""
        if not is_int(num) or num < 0:
            raise KVLibError(f"the number of blocks to take must be an integer >= 0, not {num!r}")
        if num > self.num_free_blocks:
            raise KVLibError(
                f"asked for {num} blocks but only {self.num_free_blocks} are free (ask can_allocate first)"
            )
        blocks = [self.free_queue.popleft() for _ in range(num)]
        for block in blocks:
            if block.block_hash is not None:  # evict: its contents are about to be overwritten
                del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
        return blocks

    def _own(self, block: KVCacheBlock) -> KVCacheBlock:
        """``block`` itself, once it is checked to be one of this pool's blocks (not a copy, not another
        pool's block with the same id, whose ``ref_cnt`` would silently go wrong)."""
        block_id = getattr(block, "block_id", None)
        if not (
            isinstance(block, KVCacheBlock)
            and isinstance(block_id, int)
            and 0 <= block_id < len(self.blocks)
            and self.blocks[block_id] is block
        ):
            raise KVLibError(f"{block!r}"[:80] + f" is not a block of this pool of {len(self.blocks)} blocks")
        return block

    def touch(self, block: KVCacheBlock) -> None:
        """One more block table uses ``block`` (a prefix-cache hit or a fork)."""
        self._own(block)
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
        block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """One block table fewer uses each block; unused ones join the back of the free queue in order.

        A block freed more often than block tables use it (a double free) is an error, raised
        before any count changes: a ``ref_cnt`` of -1 would put the block in two tables at once later.
        """
        if not isinstance(blocks, Iterable) or isinstance(blocks, KVCacheBlock):
            raise KVLibError(f"blocks must be an iterable of this pool's blocks, not {blocks!r}"[:200])
        blocks = [self._own(block) for block in blocks]
        frees: dict[int, int] = {}
        for block in blocks:
            frees[block.block_id] = frees.get(block.block_id, 0) + 1
            if frees[block.block_id] > block.ref_cnt:
                raise KVLibError(
                    f"block {block.block_id} freed {frees[block.block_id]} time(s) but used by "
                    f"{block.ref_cnt} block table(s): a double free"
                )
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_block(self, block: KVCacheBlock, block_hash: str) -> None:
        """Register a full block under its hash, unless an equal block is cached already.

        Only a block in use can be registered: a free block's contents may be overwritten at any time.
        """
        self._own(block)
        if not isinstance(block_hash, str) or not block_hash:
            raise KVLibError(f"a block hash is a non-empty string (hash_block_tokens), not {block_hash!r}")
        if block.ref_cnt < 1:
            raise KVLibError(f"block {block.block_id} is free: only a block in use can be cached")
        if block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block

    def uncache(self, block: KVCacheBlock) -> None:
        """Take a block out of the prefix cache (if it is there): its slots are about to be written
        again (a truncated sequence's last block: :meth:`kvlib.paged.BlockManager.truncate`)."""
        self._own(block)
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = None
