"""Unit tests of the block pool, the block manager and its usage statistics (kvlib.paged.block_pool,
kvlib.paged.block_manager, kvlib.paged.usage): every operation and every error."""

import pytest

from kvlib import KVLibError
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.block_pool import BlockPool, hash_block_tokens
from kvlib.paged.usage import block_snapshot, block_usage


def tokens(n, start=0):
    return list(range(start, start + n))


# ---------------------------------------------------------------- allocate


def test_allocate_takes_ceil_blocks_and_maps_slots():
    manager = BlockManager(num_blocks=8, block_size=4)
    allocation = manager.allocate(0, tokens(10))
    assert allocation.num_new_blocks == 3 and allocation.num_cached_tokens == 0
    table = manager.block_table(0)
    assert len(table) == 3 and len(set(table)) == 3
    assert manager.num_free_blocks == 5
    # token 9 is the second slot of the third block
    assert manager.slot(0, 9) == table[2] * 4 + 1
    assert [manager.slot(0, p) // 4 for p in range(10)] == [table[p // 4] for p in range(10)]


def test_allocate_reports_running_out_instead_of_failing():
    manager = BlockManager(num_blocks=3, block_size=4)
    assert manager.can_allocate(tokens(12))
    assert not manager.can_allocate(tokens(13))
    assert manager.allocate(0, tokens(13)) is None
    assert 0 not in manager and manager.num_free_blocks == 3  # nothing changed
    assert manager.allocate(0, tokens(12)) is not None
    assert not manager.can_allocate([1]) and manager.allocate(1, [1]) is None


def test_allocate_twice_and_bad_tokens_are_errors():
    manager = BlockManager(num_blocks=4, block_size=4)
    manager.allocate(0, [1, 2])
    with pytest.raises(KVLibError, match="sequence 0 already has blocks"):
        manager.allocate(0, [3])
    with pytest.raises(KVLibError, match="at least one token"):
        manager.allocate(1, [])
    with pytest.raises(KVLibError, match="non-negative"):
        manager.allocate(1, [3, -1])
    with pytest.raises(KVLibError, match="must be integers"):
        manager.allocate(1, [1.5])


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, None])
def test_block_size_and_num_blocks_must_be_positive_integers(bad):
    with pytest.raises(KVLibError, match="block_size must be a positive integer"):
        BlockManager(num_blocks=4, block_size=bad)
    with pytest.raises(KVLibError, match="num_blocks must be a positive integer"):
        BlockManager(num_blocks=bad, block_size=4)


# ---------------------------------------------------------------- append


def test_append_takes_a_new_block_only_when_the_last_is_full():
    manager = BlockManager(num_blocks=4, block_size=4)
    seq = tokens(3)
    manager.allocate(0, seq)
    manager.mark_computed(0)
    first = manager.block_table(0)
    seq.append(7)
    slot = manager.append_slot(0)  # fills the first block
    assert manager.block_table(0) == first and slot == first[0] * 4 + 3
    seq.append(8)
    slot = manager.append_slot(0)  # needs a second block
    table = manager.block_table(0)
    assert len(table) == 2 and slot == table[1] * 4
    assert manager.token_ids(0) == [0, 1, 2, 7, 8] and manager.num_tokens(0) == 5


def test_the_manager_reads_the_callers_token_list():
    manager = BlockManager(num_blocks=4, block_size=4)
    seq = [1, 2]
    manager.allocate(0, seq)
    seq.append(3)  # appended, but without a slot yet
    assert manager.num_tokens(0) == 2 and manager.token_ids(0) == [1, 2]
    manager.append_slot(0)
    assert manager.num_tokens(0) == 3 and manager.token_ids(0) == [1, 2, 3]
    with pytest.raises(KVLibError, match="every token has a slot"):
        manager.append_slot(0)
    seq.append(-4)
    with pytest.raises(KVLibError, match="non-negative"):
        manager.append_slot(0)


def test_append_reports_running_out():
    manager = BlockManager(num_blocks=1, block_size=2)
    seq = [5]
    manager.allocate(0, seq)
    seq.append(6)
    assert manager.can_append(0) and manager.append_slot(0) is not None
    assert not manager.can_append(0)
    seq.append(7)
    assert manager.append_slot(0) is None
    assert manager.token_ids(0) == [5, 6]


def test_unknown_and_freed_sequences_are_named():
    manager = BlockManager(num_blocks=4, block_size=4)
    with pytest.raises(KVLibError, match="unknown sequence 9"):
        manager.append_slot(9)
    manager.allocate(1, [1, 2])
    manager.free(1)
    with pytest.raises(KVLibError, match="sequence 1 was already freed"):
        manager.free(1)
    with pytest.raises(KVLibError, match="sequence 1 was already freed"):
        manager.append_slot(1)
    with pytest.raises(KVLibError, match="sequence 1 was already freed"):
        manager.fork(1, 2)
    with pytest.raises(KVLibError, match="outside sequence"):
        manager.allocate(3, [1]) and manager.slot(3, 1)


# ---------------------------------------------------------------- fork and copy-on-write


def test_fork_shares_every_block_and_copy_on_write_copies_the_shared_last_block():
    copies = []
    manager = BlockManager(num_blocks=6, block_size=4, copy_block=lambda src, dst: copies.append((src, dst)))
    parent = tokens(6)
    manager.allocate(0, parent)  # blocks: one full, one with 2 of 4 slots
    manager.mark_computed(0)
    child = manager.fork(0, 1)
    assert child == parent and child is not parent  # the child's own list
    shared = manager.block_table(0)
    assert manager.block_table(1) == shared
    assert [manager.ref_cnt(b) for b in shared] == [2, 2]
    assert manager.num_free_blocks == 4  # the fork took no block

    child.append(99)
    manager.append_slot(1)  # first write into the shared last block: copy it
    table = manager.block_table(1)
    assert table[0] == shared[0] and table[1] != shared[1]
    assert copies == [(shared[1], table[1])]
    assert manager.ref_cnt(shared[1]) == 1 and manager.ref_cnt(table[1]) == 1

    parent.append(42)
    manager.append_slot(0)  # the parent is now alone in its last block: write in place
    assert manager.block_table(0) == shared and len(copies) == 1
    assert manager.token_ids(0)[-1] == 42 and manager.token_ids(1)[-1] == 99


def test_fork_of_a_full_last_block_needs_no_copy():
    copies = []
    manager = BlockManager(num_blocks=6, block_size=4, copy_block=lambda s, d: copies.append((s, d)))
    manager.allocate(0, tokens(8))
    manager.mark_computed(0)
    manager.fork(0, 1).append(1)
    manager.append_slot(1)
    assert copies == [] and manager.block_table(1)[:2] == manager.block_table(0)


def test_fork_errors():
    manager = BlockManager(num_blocks=6, block_size=4)
    manager.allocate(0, tokens(5))
    with pytest.raises(KVLibError, match="have no K/V yet"):
        manager.fork(0, 1)
    manager.mark_computed(0)
    manager.allocate(1, [1])
    with pytest.raises(KVLibError, match="cannot fork into sequence 1: it already exists"):
        manager.fork(0, 1)
    with pytest.raises(KVLibError, match="unknown sequence 7"):
        manager.fork(7, 8)


def test_copy_on_write_needs_a_free_block():
    manager = BlockManager(num_blocks=2, block_size=4)
    manager.allocate(0, tokens(6))
    manager.mark_computed(0)
    manager.fork(0, 1).append(3)
    assert manager.num_free_blocks == 0
    assert not manager.can_append(1) and manager.append_slot(1) is None


# ---------------------------------------------------------------- free


def test_free_returns_blocks_and_shared_blocks_survive_until_the_last_user():
    manager = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    manager.allocate(0, tokens(6))
    manager.mark_computed(0)
    manager.fork(0, 1)
    manager.free(0)
    assert manager.num_free_blocks == 2  # the child still uses both blocks
    assert [manager.ref_cnt(b) for b in manager.block_table(1)] == [1, 1]
    manager.free(1)
    assert manager.num_free_blocks == 4 and block_usage(manager).num_used_blocks == 0


# ---------------------------------------------------------------- prefix caching


def test_block_hash_is_chained_over_the_prefix():
    a = hash_block_tokens(None, [1, 2])
    assert a == hash_block_tokens(None, [1, 2]) and len(a) == 16
    assert hash_block_tokens(a, [3, 4]) != hash_block_tokens(hash_block_tokens(None, [9, 9]), [3, 4])
    assert hash_block_tokens(None, [1, 2]) != hash_block_tokens(None, [2, 1])
    assert hash_block_tokens(None, [12, 3]) != hash_block_tokens(None, [1, 23])


def test_a_new_request_reuses_the_full_blocks_of_a_cached_prefix():
    manager = BlockManager(num_blocks=10, block_size=4)
    system = tokens(9, start=100)  # two full blocks and one token
    manager.allocate(0, system + [1, 2])
    assert manager.allocate(1, system + [5]).num_cached_tokens == 0  # nothing is computed yet
    manager.free(1)
    manager.mark_computed(0)
    allocation = manager.allocate(2, system + [7, 8, 9])
    assert allocation.num_cached_tokens == 8 and allocation.num_new_blocks == 1
    assert manager.block_table(2)[:2] == manager.block_table(0)[:2]
    assert manager.num_computed(2) == 8
    assert block_usage(manager).num_cached_blocks == 2


def test_prefix_match_leaves_the_last_prompt_token_to_compute():
    manager = BlockManager(num_blocks=10, block_size=4)
    manager.allocate(0, tokens(8))
    manager.mark_computed(0)
    # the same 8 tokens again: only the first block may be reused, so the model still runs
    # the last token (its logits pick the first new token)
    assert manager.allocate(1, tokens(8)).num_cached_tokens == 4


def test_prefix_caching_can_be_switched_off():
    manager = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    manager.allocate(0, tokens(9))
    manager.mark_computed(0)
    assert manager.allocate(1, tokens(9)).num_cached_tokens == 0
    assert block_usage(manager).num_cached_blocks == 0


def test_freed_cached_blocks_are_reused_until_evicted_least_recently_freed_first():
    manager = BlockManager(num_blocks=4, block_size=2)
    for seq, start in ((0, 10), (1, 20)):
        manager.allocate(seq, tokens(3, start))  # one full block each, plus one partial
        manager.mark_computed(seq)
    manager.free(0)  # freed first: its blocks are evicted first
    manager.free(1)
    usage = block_usage(manager)
    assert usage.num_free_blocks == 4 and usage.num_cached_blocks == 2 and usage.num_evictable_blocks == 2
    # a hit revives a free cached block without allocating
    assert manager.allocate(2, tokens(3, 20)).num_cached_tokens == 2
    manager.free(2)
    # now sequence 0's blocks are the least recently freed: a new request evicts them first
    manager.allocate(3, [1, 2, 3])  # 2 new blocks from the front of the free queue
    assert block_usage(manager).num_cached_blocks == 1
    assert manager.allocate(4, tokens(3, 20)).num_cached_tokens == 2  # 1's prefix survived
    manager.free(4)
    manager.free(3)
    assert manager.allocate(5, tokens(3, 10)).num_cached_tokens == 0  # 0's prefix was evicted


def test_can_allocate_counts_revived_cached_blocks():
    manager = BlockManager(num_blocks=3, block_size=2)
    manager.allocate(0, tokens(5))  # 3 blocks
    manager.mark_computed(0)
    manager.free(0)
    # 4 of its tokens are cached in 2 free blocks; the new prompt needs them plus 2 new
    # blocks, but reviving the cached ones leaves only 1 free block
    assert not manager.can_allocate(tokens(5) + [9, 9])
    assert manager.allocate(1, tokens(5) + [9, 9]) is None
    assert manager.can_allocate(tokens(5))  # 2 cached + 1 new block


def test_pool_refuses_to_hand_out_more_blocks_than_it_has():
    pool = BlockPool(2)
    with pytest.raises(KVLibError, match="only 2 are free"):
        pool.get_new_blocks(3)


# ---------------------------------------------------------------- statistics


def test_usage_counts_blocks_tokens_and_internal_fragmentation():
    manager = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    manager.allocate(0, tokens(5))  # 2 blocks, 3 empty slots
    manager.allocate(1, tokens(8))  # 2 blocks, full
    manager.mark_computed(0)
    manager.fork(0, 2)  # shares 0's blocks: no new storage
    usage = block_usage(manager)
    assert (usage.num_used_blocks, usage.num_free_blocks, usage.num_sequences) == (4, 6, 3)
    assert usage.num_tokens == 5 + 8 + 5 and usage.num_stored_tokens == 13
    assert usage.internal_fragmentation == 3


def test_snapshot_copies_tables_and_reference_counts():
    manager = BlockManager(num_blocks=6, block_size=4)
    manager.allocate(0, tokens(5))
    manager.mark_computed(0)
    child = manager.fork(0, 1)
    snap = block_snapshot(manager)
    assert snap.block_tables == {0: manager.block_table(0), 1: manager.block_table(0)}
    assert snap.num_tokens == {0: 5, 1: 5} and set(snap.ref_cnt.values()) == {2}
    assert snap.cached == frozenset(manager.block_table(0)[:1])
    child.append(3)
    manager.append_slot(1)
    assert snap.block_tables[1] == snap.block_tables[0]  # the snapshot did not change


def test_mark_computed_rejects_impossible_counts():
    manager = BlockManager(num_blocks=4, block_size=4)
    manager.allocate(0, tokens(5))
    with pytest.raises(KVLibError, match="cannot mark 6 tokens computed"):
        manager.mark_computed(0, 6)
    manager.mark_computed(0, 4)
    with pytest.raises(KVLibError, match="cannot mark 3 tokens computed"):
        manager.mark_computed(0, 3)
