"""Per-sequence block tables over a block pool: allocation, copy-on-write and prefix hashing (chapter 3).

PagedAttention (Kwon et al. 2023, vLLM) stores a sequence's keys and values in fixed-size
*blocks* of ``block_size`` token slots that may lie anywhere in one preallocated pool, the
way an operating system maps a process's pages onto physical frames. A sequence's
``block_table`` lists the physical block of each of its logical blocks; token ``pos`` lives
in slot ``block_table[pos // block_size] * block_size + pos % block_size``.

This module is plain Python: it decides which block holds which token and never touches
a tensor. The blocks, their ``ref_cnt`` and the prefix cache live in
:class:`kvlib.paged.block_pool.BlockPool`; :class:`kvlib.paged.paged_cache.PagedKVCache`
owns the K/V storage and asks a :class:`BlockManager` where to write; chapter 4's serving
engine (:mod:`kvlib.serving.engine`) schedules requests with the same manager. What the
blocks hold at a moment (statistics, snapshots for figures) is computed from the outside,
by :mod:`kvlib.paged.usage`. The vocabulary follows vLLM: ``block_size``, ``num_blocks``,
``ref_cnt``, ``block_table``, ``block_hash``, slot mapping.

- Tokens have one owner, the caller: ``allocate(seq_id, token_ids)`` keeps a reference to
  the caller's list and only ever reads it. The caller appends each new token to its list,
  then ``append_slot(seq_id)`` gives that token a slot; ``fork`` returns the child's own
  list (a copy of the parent's tokens), which the caller owns from then on.
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
- Rollback (chapter 8, speculative decoding): ``append_slot(seq_id, speculative=True)`` slots
  a draft token, ``accept(seq_id, n)`` keeps the first ``n`` and releases the rest, and
  ``truncate`` releases any tail. Only full, computed blocks without a draft token get a
  published hash: a block filled by rejected draft tokens is never found by the prefix cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvlib import KVLibError
from kvlib.checks import check_seq_id, checked_token_ids, is_int, require_int
from kvlib.paged.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from kvlib.units import ceil_div


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens: the last one may be partly empty."""
    return ceil_div(num_tokens, block_size)


@dataclass
class SequenceBlocks:
    """What the manager knows about one sequence."""

    seq_id: int
    token_ids: Sequence[int]  # the caller's list (read only): prompt, then the tokens it appended
    block_table: list[int]  # physical block of each logical block
    num_tokens: int  # tokens with a slot: token_ids[:num_tokens]
    block_hashes: list[str] = field(default_factory=list)  # of its first full, computed blocks
    num_computed: int = 0  # tokens whose K/V have been written
    num_speculative: int = 0  # newest tokens with a slot that are draft tokens, not verified yet


@dataclass(frozen=True)
class Allocation:
    """Result of :meth:`BlockManager.allocate`: how many prompt tokens were already cached."""

    seq_id: int
    num_cached_tokens: int  # leading prompt tokens whose K/V the prefix cache held
    num_new_blocks: int  # blocks taken from the free queue


class BlockManager:
    """Per-sequence block tables over one :class:`BlockPool`: allocate, append, fork, free.

    ``copy_block(src, dst)`` is called when copy-on-write needs the contents of block
    ``src`` copied into block ``dst`` (the paged cache copies its K/V tensors there).
    Chapter 3 builds it; chapter 4's engine schedules requests with it.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        copy_block: Callable[[int, int], None] | None = None,
    ):
        if not is_int(block_size) or block_size < 1:
            raise KVLibError(f"block_size must be a positive integer, not {block_size!r}")
        if not isinstance(enable_prefix_caching, bool):
            raise KVLibError(f"enable_prefix_caching must be True or False, not {enable_prefix_caching!r}")
        if copy_block is not None and not callable(copy_block):
            raise KVLibError(f"copy_block must be a function (src, dst) or None, not {copy_block!r}")
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.copy_block = copy_block
        self.sequences: dict[int, SequenceBlocks] = {}
        self._freed: set[int] = set()

    # ------------------------------------------------------------------ queries

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, used or free."""
        return len(self.pool.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence uses (cached ones included)."""
        return self.pool.num_free_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks of this manager's ``block_size`` needed to hold ``num_tokens`` tokens."""
        return num_blocks_for(require_int(num_tokens, "num_tokens", 0), self.block_size)

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block table."""
        return list(self._get(seq_id).block_table)

    def token_ids(self, seq_id: int) -> list[int]:
        """A copy of the sequence's tokens that have a slot."""
        seq = self._get(seq_id)
        return list(seq.token_ids[: seq.num_tokens])

    def num_tokens(self, seq_id: int) -> int:
        """Tokens of the sequence that have a slot."""
        return self._get(seq_id).num_tokens

    def num_computed(self, seq_id: int) -> int:
        """Tokens of the sequence whose K/V are written."""
        return self._get(seq_id).num_computed

    def num_speculative(self, seq_id: int) -> int:
        """Draft tokens at the end of the sequence that have a slot but are not verified yet."""
        return self._get(seq_id).num_speculative

    def slot(self, seq_id: int, position: int) -> int:
        """Index of the slot holding token ``position`` of a sequence, counted over the whole pool."""
        seq = self._get(seq_id)
        position = require_int(position, "a token position", low=None)
        if not 0 <= position < seq.num_tokens:
            raise KVLibError(f"position {position} is outside sequence {seq_id} of {seq.num_tokens} tokens")
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def ref_cnt(self, block_id: int) -> int:
        """How many block tables point at a block (``block_id`` from 0 to ``num_blocks - 1``).

        Python's negative indices are refused: ``ref_cnt(-1)`` would report the last block's count.
        """
        block_id = require_int(block_id, "a block id", low=None)
        if not 0 <= block_id < self.num_blocks:
            raise KVLibError(f"block id {block_id} is outside the pool of {self.num_blocks} blocks")
        return self.pool.blocks[block_id].ref_cnt

    def __contains__(self, seq_id: int) -> bool:
        try:
            return seq_id in self.sequences
        except TypeError:  # an unhashable value is no sequence id
            return False

    # ------------------------------------------------------------------ allocate / append

    def _cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[KVCacheBlock], list[str]]:
        """Cached blocks (and their hashes) of the longest cached prefix of ``token_ids``.

        At most ``len - 1`` tokens are matched so that the last prompt token is always
        computed: its logits choose the first new token.
        """
        hits, hashes, parent = [], [], None
        if not self.enable_prefix_caching:
            return hits, hashes
        for i in range((len(token_ids) - 1) // self.block_size):
            parent = hash_block_tokens(parent, token_ids[i * self.block_size : (i + 1) * self.block_size])
            block = self.pool.cached.get(parent)
            if block is None:
                break
            hits.append(block)
            hashes.append(parent)
        return hits, hashes

    def _blocks_short(self, token_ids: Sequence[int]) -> int:
        """How many more free blocks ``allocate(token_ids)`` would need than there are (<= 0: it fits)."""
        hits, _ = self._cached_prefix(token_ids)
        num_new = self.num_blocks_for(len(token_ids)) - len(hits)
        num_revived = sum(1 for block in hits if block.ref_cnt == 0)  # leave the free queue when hit
        return num_new - (self.num_free_blocks - num_revived)

    def can_allocate(self, token_ids: Sequence[int]) -> bool:
        """Are there enough free blocks to hold this prompt (after prefix-cache hits)?"""
        return self._blocks_short(checked_token_ids(token_ids)) <= 0

    def num_blocks_short(self, token_ids: Sequence[int]) -> int:
        """Free blocks that ``allocate(token_ids)`` would lack (negative: how many would stay free).

        Chapter 4's scheduler admits a request only if enough blocks stay free afterwards.
        """
        return self._blocks_short(checked_token_ids(token_ids))

    def allocate(self, seq_id: int, token_ids: Sequence[int]) -> Allocation | None:
        """Give a new sequence blocks for its prompt, reusing cached prefix blocks; ``None`` if short.

        The manager keeps a reference to ``token_ids`` (the caller's list, which the caller
        goes on appending to) and only reads it; every token in it now gets a slot. Returns
        how many leading prompt tokens already have K/V in the cache (a multiple of
        ``block_size``); the caller runs the model on the remaining tokens only.
        """
        self._check_new(seq_id, token_ids)
        if self._blocks_short(token_ids) > 0:
            return None
        hits, hashes = self._cached_prefix(token_ids)
        for block in hits:
            self.pool.touch(block)
        new = self.pool.get_new_blocks(self.num_blocks_for(len(token_ids)) - len(hits))
        table = [b.block_id for b in hits + new]
        num_cached = len(hits) * self.block_size
        self.sequences[seq_id] = SequenceBlocks(seq_id, token_ids, table, len(token_ids), hashes, num_cached)
        self._freed.discard(seq_id)
        return Allocation(seq_id, num_cached, len(new))

    def _needs_block(self, seq: SequenceBlocks) -> bool:
        """Appending needs a block when the last one is full, or shared (copy-on-write)."""
        if seq.num_tokens % self.block_size == 0:
            return True
        return self.pool.blocks[seq.block_table[-1]].ref_cnt > 1

    def can_append(self, seq_id: int) -> bool:
        """Can one more token be given a slot in this sequence without running out of blocks?"""
        seq = self._get(seq_id)
        return not self._needs_block(seq) or self.num_free_blocks >= 1

    def append_slot(self, seq_id: int, speculative: bool = False) -> int | None:
        """Give the sequence's next token a slot; returns the slot, or ``None`` if no block is free.

        The token is the first of the caller's list without a slot: the caller appends it to
        its list first. A new block is taken only when the last one is full. If the last
        block is shared with a forked sequence, it is copied first (copy-on-write) so that
        the write that follows never changes what the other sequences see. A ``speculative``
        token (a draft model's guess) stays out of every published hash until :meth:`accept`
        keeps it; verified tokens cannot follow draft ones.
        """
        seq = self._get(seq_id)
        if not isinstance(speculative, bool):
            raise KVLibError(f"speculative must be True or False, not {speculative!r}")
        if seq.num_speculative and not speculative:
            raise KVLibError(
                f"sequence {seq_id} has {seq.num_speculative} draft tokens: accept or truncate them "
                "before appending a verified token"
            )
        if seq.num_tokens >= len(seq.token_ids):
            raise KVLibError(
                f"sequence {seq_id}: every token has a slot; append the new token to its token list first"
            )
        checked_token_ids(seq.token_ids[seq.num_tokens : seq.num_tokens + 1])
        if not self.can_append(seq_id):
            return None
        if seq.num_tokens % self.block_size == 0:
            seq.block_table.append(self.pool.get_new_blocks(1)[0].block_id)
        elif self._needs_block(seq):
            self._copy_last_block(seq)
        else:  # private: if published before a truncate (shared then, freed since), it leaves the cache
            self.pool.uncache(self.pool.blocks[seq.block_table[-1]])
        seq.num_tokens += 1
        seq.num_speculative += speculative
        return self.slot(seq_id, seq.num_tokens - 1)

    def _copy_last_block(self, seq: SequenceBlocks) -> None:
        """Copy-on-write: the sequence's shared last block is replaced by a private copy."""
        shared = self.pool.blocks[seq.block_table[-1]]
        copy = self.pool.get_new_blocks(1)[0]
        if self.copy_block is not None:
            self.copy_block(shared.block_id, copy.block_id)
        self.pool.free_blocks([shared])
        seq.block_table[-1] = copy.block_id

    def mark_computed(self, seq_id: int, num_tokens: int | None = None) -> None:
        """Record that the K/V of the first ``num_tokens`` tokens (default: all with a slot) are written.

        Full blocks become visible to the prefix cache only now, so a later request never
        reuses a block whose K/V do not exist yet (vLLM's ``cache_blocks``); a block holding a
        draft token waits for :meth:`accept`.
        """
        seq = self._get(seq_id)
        seq.num_computed = computed_count(seq, seq_id, num_tokens)
        self._publish(seq)

    def _publish(self, seq: SequenceBlocks) -> None:
        """Hash (and offer to the prefix cache) every full block whose tokens are computed and verified."""
        if not self.enable_prefix_caching:
            return
        size, num_verified = self.block_size, min(seq.num_computed, seq.num_tokens - seq.num_speculative)
        for i in range(len(seq.block_hashes), num_verified // size):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            block_hash = hash_block_tokens(parent, seq.token_ids[i * size : (i + 1) * size])
            seq.block_hashes.append(block_hash)
            self.pool.cache_block(self.pool.blocks[seq.block_table[i]], block_hash)

    # ------------------------------------------------------------------ rollback

    def accept(self, seq_id: int, num_accepted: int) -> None:
        """Verify the first ``num_accepted`` draft tokens and release the slots of the rest.

        The kept tokens become ordinary ones: full computed blocks of them are published now.
        The caller then drops the rejected tokens from its list.
        """
        seq = self._get(seq_id)
        num_accepted = require_int(num_accepted, "num_accepted", low=None)
        if not 0 <= num_accepted <= seq.num_speculative:
            raise KVLibError(
                f"sequence {seq_id}: cannot accept {num_accepted} of its {seq.num_speculative} draft tokens"
            )
        self.truncate(seq_id, seq.num_tokens - seq.num_speculative + num_accepted)
        seq.num_speculative = 0
        self._publish(seq)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` slots of a sequence and release the tail (a rollback).

        Blocks left empty are freed, tail first (a shared one loses this table's reference).
        A published last block left partly empty leaves the prefix cache unless shared, for this
        sequence will write its tail again (a shared one is copied first). The caller then
        drops the released tokens from its list.
        """
        seq = self._get(seq_id)
        num_tokens = require_int(num_tokens, "num_tokens", low=None)
        if not 1 <= num_tokens <= seq.num_tokens:
            raise KVLibError(f"sequence {seq_id}: cannot keep {num_tokens} of its {seq.num_tokens} tokens")
        keep = self.num_blocks_for(num_tokens)
        self.pool.free_blocks(self.pool.blocks[b] for b in reversed(seq.block_table[keep:]))
        del seq.block_table[keep:]
        last = self.pool.blocks[seq.block_table[-1]]
        if num_tokens % self.block_size and last.ref_cnt == 1:
            self.pool.uncache(last)  # its tail slots are about to be overwritten
        del seq.block_hashes[num_tokens // self.block_size :]
        seq.num_speculative = max(0, seq.num_speculative - (seq.num_tokens - num_tokens))
        seq.num_tokens, seq.num_computed = num_tokens, min(seq.num_computed, num_tokens)

    # ------------------------------------------------------------------ fork / free

    def fork(self, parent_id: int, child_id: int) -> list[int]:
        """Make ``child_id`` a copy of ``parent_id`` that shares all of its blocks (ref_cnt + 1 each).

        Returns the child's token list: a new list holding the parent's tokens, which the
        caller owns from now on (it appends the child's tokens to it, as for any sequence).
        """
        parent = self._get(parent_id)
        check_seq_id(child_id)
        if child_id in self.sequences:
            raise KVLibError(f"cannot fork into sequence {child_id}: it already exists")
        if parent.num_speculative:
            raise KVLibError(f"cannot fork sequence {parent_id} while it holds draft tokens (accept first)")
        if parent.num_computed < parent.num_tokens:
            raise KVLibError(
                f"cannot fork sequence {parent_id}: {parent.num_tokens - parent.num_computed} "
                "of its tokens have no K/V yet (run the model first)"
            )
        for block_id in parent.block_table:
            self.pool.touch(self.pool.blocks[block_id])
        child_tokens = list(parent.token_ids[: parent.num_tokens])
        self.sequences[child_id] = SequenceBlocks(
            child_id,
            child_tokens,
            list(parent.block_table),
            parent.num_tokens,
            list(parent.block_hashes),
            parent.num_computed,
        )
        self._freed.discard(child_id)
        return child_tokens

    def free(self, seq_id: int) -> None:
        """Release a finished (or preempted) sequence's blocks.

        Blocks are freed last block first, so that a sequence's tail is evicted before its
        prefix, which other requests are likelier to share.
        """
        seq = self._get(seq_id)
        self.pool.free_blocks(self.pool.blocks[b] for b in reversed(seq.block_table))
        del self.sequences[seq_id]
        self._freed.add(seq_id)

    # ------------------------------------------------------------------ checks

    def _check_new(self, seq_id, token_ids: Sequence[int]) -> None:
        """What :meth:`allocate` checks first: token ids, a hashable id that holds no blocks yet."""
        checked_token_ids(token_ids)
        check_seq_id(seq_id)
        if seq_id in self.sequences:
            raise KVLibError(f"sequence {seq_id} already has blocks (free it first or pick a new id)")

    def _get(self, seq_id: int) -> SequenceBlocks:
        check_seq_id(seq_id)
        seq = self.sequences.get(seq_id)
        if seq is None:
            if seq_id in self._freed:
                raise KVLibError(f"sequence {seq_id} was already freed")
            raise KVLibError(f"unknown sequence {seq_id!r}")
        return seq


def computed_count(seq, seq_id, num_tokens: int | None) -> int:
    """``mark_computed``'s count for ``seq`` (a sequence's blocks, any manager's): ``num_tokens``,
    default all its tokens, from those already computed up to those with a slot; else a KVLibError."""
    num_tokens = seq.num_tokens if num_tokens is None else require_int(num_tokens, "num_tokens", low=None)
    if not seq.num_computed <= num_tokens <= seq.num_tokens:
        raise KVLibError(
            f"sequence {seq_id}: cannot mark {num_tokens} tokens computed "
            f"(has {seq.num_tokens}, {seq.num_computed} computed)"
        )
    return num_tokens
