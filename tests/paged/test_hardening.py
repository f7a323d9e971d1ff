"""Bad input to the block pool and the block manager is a one-line KVLibError, never silent corruption
(a double free drove ref_cnt to -1, a block of another pool was accepted, ``ref_cnt(-1)``
answered for the last block, ``mark_computed(0, 4.0)`` stored the float)."""

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.block_pool import BlockPool, KVCacheBlock, hash_block_tokens


def test_a_double_free_is_refused_and_changes_nothing():
    pool = BlockPool(4)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    assert (block.ref_cnt, pool.num_free_blocks) == (0, 4)
    with pytest.raises(KVLibError, match="block 0 freed 1 time.* a double free"):
        pool.free_blocks([block])
    assert (block.ref_cnt, pool.num_free_blocks) == (0, 4)


def test_freeing_a_block_twice_in_one_call_is_refused_before_any_count_changes():
    pool = BlockPool(4)
    first, second = pool.get_new_blocks(2)
    with pytest.raises(KVLibError, match="block 1 freed 2 time"):
        pool.free_blocks([first, second, second])
    assert (first.ref_cnt, second.ref_cnt, pool.num_free_blocks) == (1, 1, 2)


def test_a_shared_block_can_be_freed_once_per_user():
    pool = BlockPool(2)
    (block,) = pool.get_new_blocks(1)
    pool.touch(block)  # a second block table uses it
    pool.free_blocks([block, block])  # both tables let go in one call: allowed
    assert (block.ref_cnt, pool.num_free_blocks) == (0, 2)


@pytest.mark.parametrize("method", ["free_blocks", "touch", "cache_block"])
def test_a_block_of_another_pool_is_refused(method):
    pool, other = BlockPool(4), BlockPool(4)
    (foreign,) = other.get_new_blocks(1)  # block 0 of the other pool, in use there
    pool.get_new_blocks(1)  # and block 0 of this pool, in use here
    call = {
        "free_blocks": lambda: pool.free_blocks([foreign]),
        "touch": lambda: pool.touch(foreign),
        "cache_block": lambda: pool.cache_block(foreign, "abc"),
    }[method]
    with pytest.raises(KVLibError, match="is not a block of this pool"):
        call()
    assert (pool.blocks[0].ref_cnt, foreign.ref_cnt) == (1, 1)


@pytest.mark.parametrize("bad", [KVCacheBlock(0), KVCacheBlock(7), "0", 0])
def test_copies_out_of_range_ids_and_non_blocks_are_refused(bad):
    pool = BlockPool(4)
    pool.get_new_blocks(1)
    with pytest.raises(KVLibError, match="not a block of this pool of 4 blocks"):
        pool.free_blocks([bad])


@pytest.mark.parametrize("num", [-1, 1.0, True, "2", None])
def test_get_new_blocks_needs_a_count(num):
    with pytest.raises(KVLibError, match="number of blocks to take must be an integer >= 0"):
        BlockPool(4).get_new_blocks(num)


def test_only_a_block_in_use_is_cached_under_a_string_hash():
    pool = BlockPool(2)
    with pytest.raises(KVLibError, match="block 0 is free"):
        pool.cache_block(pool.blocks[0], "abc")
    (block,) = pool.get_new_blocks(1)
    with pytest.raises(KVLibError, match="block hash is a non-empty string"):
        pool.cache_block(block, 123)
    assert pool.cached == {}


def test_hash_of_non_integer_tokens_is_an_error():
    with pytest.raises(KVLibError, match="token ids must be integers"):
        hash_block_tokens(None, [1, 2.5])


@pytest.mark.parametrize("block_id", [-1, 4, 1.0, True, "0"])
def test_ref_cnt_needs_a_block_id_of_the_pool(block_id):
    manager = BlockManager(num_blocks=4, block_size=4)
    manager.allocate(0, [1, 2, 3, 4, 5])  # blocks 0 and 1; block 3 (the last, id -1 in Python) is free
    with pytest.raises(KVLibError, match="block id"):
        manager.ref_cnt(block_id)


def test_ref_cnt_accepts_numpy_integers():
    manager = BlockManager(num_blocks=4, block_size=4)
    manager.allocate(0, [1, 2, 3, 4, 5])
    assert manager.ref_cnt(np.int64(0)) == 1 and manager.ref_cnt(3) == 0


@pytest.mark.parametrize("num_tokens", [4.0, True, "4"])
def test_mark_computed_needs_an_integer_count_and_stores_nothing_else(num_tokens):
    manager = BlockManager(num_blocks=4, block_size=4)
    manager.allocate(0, [1, 2, 3, 4, 5])
    with pytest.raises(KVLibError, match="num_tokens must be an integer"):
        manager.mark_computed(0, num_tokens)
    assert manager.num_computed(0) == 0
    manager.mark_computed(0, np.int64(4))  # a numpy integer is an integer
    assert manager.num_computed(0) == 4 and type(manager.num_computed(0)) is int


@pytest.mark.parametrize("position", [1.0, True, None])
def test_slot_needs_an_integer_position(position):
    manager = BlockManager(num_blocks=4, block_size=4)
    manager.allocate(0, [1, 2, 3, 4, 5])
    with pytest.raises(KVLibError, match="a token position must be an integer"):
        manager.slot(0, position)


def test_manager_options_are_checked():
    with pytest.raises(KVLibError, match="enable_prefix_caching must be True or False"):
        BlockManager(4, 4, enable_prefix_caching="no")
    with pytest.raises(KVLibError, match="copy_block must be a function"):
        BlockManager(4, 4, copy_block=3)


def test_a_pool_too_large_to_build_is_refused_at_once():
    """BlockPool(10**9) built Python objects for minutes (and all memory) instead of failing."""
    from kvlib.paged.block_pool import MAX_NUM_BLOCKS

    with pytest.raises(KVLibError, match="num_blocks 1,000,000,000 exceeds the 4,194,304 blocks"):
        BlockPool(10**9)
    assert MAX_NUM_BLOCKS == 2**22


@pytest.mark.parametrize("call", ["allocate", "block_table", "fork"])
def test_an_unhashable_sequence_id_is_named(call):
    manager = BlockManager(num_blocks=8, block_size=4)
    manager.allocate(0, [1, 2, 3, 4])
    manager.mark_computed(0)
    run = {
        "allocate": lambda: manager.allocate([1], [1, 2]),
        "block_table": lambda: manager.block_table([1]),
        "fork": lambda: manager.fork(0, [2]),
    }[call]
    with pytest.raises(KVLibError, match="a sequence id must be hashable"):
        run()
