"""A block manager whose prefix cache is a radix tree (chapter 11): SGLang's RadixAttention on a block pool.

:class:`RadixBlockManager` is a :class:`~kvlib.paged.block_manager.BlockManager` (block tables,
copy-on-write, ``allocate`` / ``append_slot`` / ``free``) whose prefix cache is a
:class:`~kvlib.paged.radix_tree.RadixTree` with one page per block, instead of the pool's table of
block hashes:

- a prompt's cached blocks are those along its :meth:`~kvlib.paged.radix_tree.RadixTree.match_prefix`
  (never its last token, whose logits the prefill must compute), and the request locks the node
  its match ends at until it is freed;
- a sequence's full, computed blocks are inserted into the tree as soon as their K/V exist
  (SGLang's ``cache_unfinished_req`` after a prefill, ``cache_finished_req`` at the end), so that
  a request running beside it can share them; its lock moves down to the new node. The tree keeps
  one reference on each block it stores; a sequence's blocks for a prefix stored already by
  another stay its own and go back to the pool when it is freed;
- when the pool lacks free blocks, unlocked leaves are evicted, least recently used first
  (:meth:`~kvlib.paged.radix_tree.RadixTree.evict`), and their blocks freed.

``block_size = 1`` gives SGLang's default, a token per page; ``block_size = 16`` the hash cache's
granularity. The model runs on it as on any :class:`~kvlib.paged.paged_cache.PagedKVCache`
(:func:`radix_paged_cache`). ``num_lookup_tokens`` and ``num_hit_tokens`` count the prompt tokens
allocated and those found cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvlib.paged.block_manager import Allocation, BlockManager, SequenceBlocks
from kvlib.paged.block_pool import KVCacheBlock
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.paged.radix_tree import PrefixMatch, RadixNode, RadixTree


class RadixBlockManager(BlockManager):
    """Block tables over a pool whose prefix cache is a radix tree of blocks (see the module's docstring)."""

    def __init__(
        self, num_blocks: int, block_size: int, copy_block: Callable[[int, int], None] | None = None
    ):
        super().__init__(num_blocks, block_size, enable_prefix_caching=True, copy_block=copy_block)
        self.tree = RadixTree(block_size)
        self._locked: dict[int, RadixNode] = {}  # seq_id -> the node its cached prefix ends at
        self._published: dict[int, int] = {}  # seq_id -> its leading tokens inserted into the tree
        self.num_lookup_tokens = 0  # prompt tokens allocated
        self.num_hit_tokens = 0  # of them, found in the tree

    # ------------------------------------------------------------------ what the base class asks

    @property
    def num_free_blocks(self) -> int:
        """Blocks free in the pool plus those the tree could give back (unlocked ones), as SGLang counts."""
        return self.pool.num_free_blocks + self.tree.evictable_tokens // self.block_size

    def _match(self, token_ids: Sequence[int]) -> PrefixMatch:
        return self.tree.match_prefix(token_ids[: len(token_ids) - 1])  # the last token is computed

    def _cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[KVCacheBlock], list[str]]:
        match = self._match(token_ids)
        return [self.pool.blocks[b] for b in match.values], []

    def _blocks_short(self, token_ids: Sequence[int]) -> int:
        match = self._match(token_ids)
        num_new = self.num_blocks_for(len(token_ids)) - len(match.values)
        unlocked_hits, node = 0, match.node  # evictable now, but the allocation will lock them
        while node is not self.tree.root:
            if node.lock_ref == 0:
                unlocked_hits += len(node.values)
            node = node.parent
        return num_new - (self.num_free_blocks - unlocked_hits)

    def _publish(self, seq: SequenceBlocks) -> None:
        """Insert the sequence's full, computed, verified blocks into the tree (those not inserted yet),
        and move its lock to the node they end at (SGLang's ``cache_unfinished_req``)."""
        size = self.block_size
        num_full = min(seq.num_computed, seq.num_tokens - seq.num_speculative) // size * size
        if num_full <= self._published.get(seq.seq_id, 0):
            return
        table = seq.block_table[: num_full // size]
        num_stored = self.tree.insert(seq.token_ids[:num_full], table)
        for block_id in table[num_stored // size :]:
            self.pool.touch(self.pool.blocks[block_id])
        node = self.tree.match_prefix(seq.token_ids[:num_full]).node
        self.tree.lock(node)
        old = self._locked.get(seq.seq_id)
        if old is not None:
            self.tree.unlock(old)
        self._locked[seq.seq_id] = node
        self._published[seq.seq_id] = num_full

    def _make_room(self, num_blocks: int) -> None:
        """Evict unlocked leaves until the pool has ``num_blocks`` free blocks."""
        short = num_blocks - self.pool.num_free_blocks
        if short > 0:
            self.tree.evict(short * self.block_size, self._release)

    def _release(self, block_ids: list) -> None:
        self.pool.free_blocks(self.pool.blocks[b] for b in block_ids)

    # ------------------------------------------------------------------ allocate / append / free

    def allocate(self, seq_id: int, token_ids: Sequence[int]) -> Allocation | None:
        """Blocks for a prompt: the tree's matched blocks, then new ones (evicting leaves if the pool is
        short); ``None`` if even eviction leaves too few. The match stays locked until :meth:`free`."""
        self._check_new(seq_id, token_ids)
        if self._blocks_short(token_ids) > 0:
            return None
        match = self._match(token_ids)
        self.tree.lock(match.node)
        self._make_room(self.num_blocks_for(len(token_ids)) - len(match.values))
        allocation = super().allocate(seq_id, token_ids)
        self._locked[seq_id] = match.node
        self.num_lookup_tokens += len(token_ids)
        self.num_hit_tokens += allocation.num_cached_tokens
        return allocation

    def append_slot(self, seq_id: int, speculative: bool = False) -> int | None:
        """:meth:`BlockManager.append_slot`, a leaf evicted first if the pool has no free block."""
        seq = self._get(seq_id)
        if self._needs_block(seq) and self.can_append(seq_id):
            self._make_room(1)
        return super().append_slot(seq_id, speculative)

    def fork(self, parent_id: int, child_id: int) -> list[int]:
        """:meth:`BlockManager.fork`; the child holds the parent's lock on the tree too."""
        tokens = super().fork(parent_id, child_id)
        node = self._locked.get(parent_id)
        if node is not None:
            self.tree.lock(node)
            self._locked[child_id] = node
        self._published[child_id] = self._published.get(parent_id, 0)
        return tokens

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """:meth:`BlockManager.truncate`; the tree keeps the blocks it stored (their K/V hold for their
        tokens), and blocks written after the cut are inserted anew."""
        super().truncate(seq_id, num_tokens)
        size = self.block_size
        if seq_id in self._published:
            self._published[seq_id] = min(self._published[seq_id], self.num_tokens(seq_id) // size * size)

    def free(self, seq_id: int) -> None:
        """Insert the sequence's last full blocks into the tree (:meth:`_publish`), unlock its node, then
        free its blocks (the tree keeps its own reference on each block it stores)."""
        self._publish(self._get(seq_id))
        node = self._locked.pop(seq_id, None)
        if node is not None:
            self.tree.unlock(node)
        self._published.pop(seq_id, None)
        super().free(seq_id)

    @property
    def hit_rate(self) -> float:
        """Share of the prompt tokens allocated so far that the tree held (0 before any)."""
        return self.num_hit_tokens / self.num_lookup_tokens if self.num_lookup_tokens else 0.0


def radix_paged_cache(model, num_blocks: int, block_size: int) -> PagedKVCache:
    """A :class:`PagedKVCache` for ``model`` whose blocks a :class:`RadixBlockManager` hands out."""
    cache = PagedKVCache.for_model(model, num_blocks, block_size, enable_prefix_caching=False)
    cache.manager = RadixBlockManager(num_blocks, block_size, copy_block=cache._copy_block)
    return cache
