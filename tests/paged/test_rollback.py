"""Rollback in the block manager (chapter 8, speculative decoding): draft tokens get slots with
``append_slot(speculative=True)``, ``accept`` keeps some and releases the rest, ``truncate``
releases any tail. Every count below is worked out by hand from the block size."""

import pytest

from kvlib import KVLibError
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.block_pool import hash_block_tokens


def speculate(manager, tokens, seq_id, drafts):
    """Append draft tokens to the caller's list and give each a speculative slot."""
    for token in drafts:
        tokens.append(token)
        assert manager.append_slot(seq_id, speculative=True) is not None


def test_rejected_draft_block_is_never_published_nor_found():
    manager = BlockManager(num_blocks=6, block_size=4)
    tokens = [1, 2, 3]
    manager.allocate(0, tokens)
    manager.mark_computed(0)
    speculate(manager, tokens, 0, [9, 8, 7, 6, 5])  # 3 + 5 = 8 tokens: 8 / 4 = 2 blocks
    assert manager.num_speculative(0) == 5 and len(manager.block_table(0)) == 2
    manager.mark_computed(0)  # the verification pass wrote all 8 K/V
    assert manager.pool.cached == {}  # block 0 = [1, 2, 3, 9] holds a draft token: not published
    manager.accept(0, 0)  # every draft rejected: back to 3 tokens in 1 block
    del tokens[3:]
    assert manager.num_tokens(0) == 3 and manager.num_computed(0) == 3 and manager.num_speculative(0) == 0
    assert len(manager.block_table(0)) == 1 and manager.num_free_blocks == 6 - 1
    assert manager.allocate(1, [1, 2, 3, 9, 4]).num_cached_tokens == 0  # nothing to find


def test_accepted_drafts_are_published_like_plain_appends():
    manager = BlockManager(num_blocks=6, block_size=4)
    tokens = [1, 2, 3]
    manager.allocate(0, tokens)
    manager.mark_computed(0)
    speculate(manager, tokens, 0, [9, 8, 7])
    manager.mark_computed(0)
    manager.accept(0, 2)  # keeps 9, 8: 3 + 2 = 5 tokens, 2 blocks; 7 is released
    del tokens[5:]
    assert manager.token_ids(0) == [1, 2, 3, 9, 8] and manager.num_computed(0) == 5
    assert list(manager.pool.cached) == [hash_block_tokens(None, [1, 2, 3, 9])]  # the one full block
    assert manager.num_free_blocks == 6 - 2
    assert manager.allocate(1, [1, 2, 3, 9, 4]).num_cached_tokens == 4


def test_accept_frees_blocks_only_drafts_filled():
    manager = BlockManager(num_blocks=8, block_size=2)
    tokens = [1, 2]
    manager.allocate(0, tokens)
    manager.mark_computed(0)
    speculate(manager, tokens, 0, [3, 4, 5, 6, 7])  # 7 tokens: ceil(7 / 2) = 4 blocks
    assert manager.num_free_blocks == 8 - 4
    manager.accept(0, 1)  # 3 tokens: ceil(3 / 2) = 2 blocks, 2 freed
    assert manager.num_free_blocks == 8 - 2 and manager.num_tokens(0) == 3


def test_rollback_of_a_forked_sequence_keeps_the_shared_block_intact():
    copies = []
    manager = BlockManager(num_blocks=8, block_size=4, copy_block=lambda s, d: copies.append((s, d)))
    parent = [1, 2, 3, 4, 5, 6]  # 2 blocks, the second half full
    manager.allocate(0, parent)
    manager.mark_computed(0)
    child = manager.fork(0, 1)
    shared = manager.block_table(0)
    assert [manager.ref_cnt(b) for b in shared] == [2, 2]
    speculate(manager, parent, 0, [7, 8, 9])  # the first draft lands in the shared block: copy-on-write
    assert copies == [(shared[1], manager.block_table(0)[1])]
    manager.accept(0, 0)
    del parent[6:]
    assert manager.block_table(1) == shared and manager.block_table(0)[0] == shared[0]
    assert [manager.ref_cnt(b) for b in manager.block_table(0)] == [2, 1]  # own copy of block 1
    assert manager.ref_cnt(shared[1]) == 1  # the child alone, which now writes it in place
    child.append(10)
    manager.append_slot(1)
    assert len(copies) == 1 and manager.block_table(1) == shared
    assert manager.num_free_blocks == 8 - 3  # blocks 0 and 1 shared once, the parent's copy


def test_truncating_into_a_published_block_withdraws_it_unless_shared():
    manager = BlockManager(num_blocks=8, block_size=4)
    first = list(range(9))  # blocks [0..3], [4..7] published, [8] partial
    manager.allocate(0, first)
    manager.mark_computed(0)
    second = list(range(9))
    assert manager.allocate(1, second).num_cached_tokens == 8  # shares both full blocks
    manager.truncate(1, 6)  # its 2nd block is shared with sequence 0: stays published
    del second[6:]
    assert manager.allocate(2, list(range(9))).num_cached_tokens == 8
    manager.free(2)
    second.append(99)
    manager.append_slot(1)  # writes slot 6 of a shared block: copy-on-write, never in place
    assert manager.block_table(1)[1] != manager.block_table(0)[1]
    manager.free(1)
    manager.truncate(0, 6)  # now its own: slots 6, 7 will be written again, so it leaves the cache
    del first[6:]
    assert manager.allocate(3, list(range(9))).num_cached_tokens == 4
    assert manager.num_computed(0) == 6 and manager.token_ids(0) == [0, 1, 2, 3, 4, 5]


def test_rollback_errors_name_the_problem():
    manager = BlockManager(num_blocks=4, block_size=4)
    tokens = [1, 2]
    manager.allocate(0, tokens)
    manager.mark_computed(0)
    speculate(manager, tokens, 0, [3])
    tokens.append(4)
    with pytest.raises(KVLibError, match="accept or truncate them before appending a verified token"):
        manager.append_slot(0)
    tokens.pop()
    with pytest.raises(KVLibError, match="cannot accept 2 of its 1 draft tokens"):
        manager.accept(0, 2)
    with pytest.raises(KVLibError, match="cannot accept -1"):
        manager.accept(0, -1)
    with pytest.raises(KVLibError, match="while it holds draft tokens"):
        manager.fork(0, 1)
    with pytest.raises(KVLibError, match="cannot keep 0 of its 3 tokens"):
        manager.truncate(0, 0)
    with pytest.raises(KVLibError, match="cannot keep 4 of its 3 tokens"):
        manager.truncate(0, 4)
    with pytest.raises(KVLibError, match="num_tokens must be an integer"):
        manager.truncate(0, 2.0)
    with pytest.raises(KVLibError, match="speculative must be True or False"):
        manager.append_slot(0, speculative=1)
    manager.truncate(0, 2)  # releases the draft too
    assert manager.num_speculative(0) == 0 and manager.num_tokens(0) == 2


def test_a_published_block_truncated_while_shared_leaves_the_cache_before_it_is_written_in_place():
    """Found by tests/paged/test_rollback_properties.py: [0, 0] fills block 0 and publishes it; a fork
    shares it; truncating the parent to [0] keeps the hash (the child still reads the full block);
    the child is freed; appending 1 to the parent writes block 0 in place (it is private now), so the
    hash of [0, 0] must leave the prefix cache first, or a later request would read [0, 1] for it."""
    manager = BlockManager(num_blocks=4, block_size=2)
    tokens = [0]
    manager.allocate(0, tokens)
    manager.mark_computed(0)
    tokens.append(0)
    manager.append_slot(0)
    manager.mark_computed(0)
    published = hash_block_tokens(None, [0, 0])
    assert published in manager.pool.cached
    manager.fork(0, 1)
    manager.truncate(0, 1)
    del tokens[1:]
    assert published in manager.pool.cached  # sequence 1 still holds [0, 0] in block 0
    manager.free(1)
    tokens.append(1)
    assert manager.append_slot(0) == 1  # block 0, slot 1: written in place
    assert published not in manager.pool.cached
    assert manager.allocate(2, [0, 0, 2]).num_cached_tokens == 0
