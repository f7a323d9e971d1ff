"""The radix tree of chapter 11 (SGLang's RadixAttention): matching in whole pages, splitting edges,
locks, LRU eviction of unlocked leaves only; and its block manager (hits, eviction, block counts),
with hypothesis properties: the matched prefix is the brute-force longest common prefix over the
stored sequences rounded down to a page, and eviction never removes a locked node."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.decode_loop import greedy_step, prefill
from kvlib.paged.radix_cache import RadixBlockManager, radix_paged_cache
from kvlib.paged.radix_tree import RadixTree
from kvlib.serving.engine import solo_tokens
from kvlib.serving.traces import Request


def lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_match_stops_where_the_stored_sequence_parts_and_splits_the_edge():
    tree = RadixTree()
    assert tree.insert([1, 2, 3, 4]) == 0
    assert tree.insert([1, 2, 5]) == 2  # two tokens were stored already
    assert sorted(tree.sequences()) == [(1, 2, 3, 4), (1, 2, 5)]
    assert tree.num_tokens == 5 and tree.num_nodes() == 3  # (1, 2) then (3, 4) and (5,)
    match = tree.match_prefix([1, 2, 3, 9])
    assert match.num_tokens == 3 and match.node.key == (3,)  # (3, 4) was split after 3
    assert tree.match_prefix([7]).num_tokens == 0 and tree.match_prefix([]).num_tokens == 0


def test_pages_match_whole_pages_only():
    tree = RadixTree(page_size=4)
    assert tree.insert(list(range(10)), ["a", "b"]) == 0  # 10 tokens: two whole pages stored
    assert tree.num_tokens == 8
    match = tree.match_prefix(list(range(7)))  # one whole page of 7 tokens
    assert (match.num_tokens, match.values) == (4, ("a",))
    assert tree.match_prefix([0, 1, 2, 3, 4, 5, 6, 99, 8]).values == ("a",)  # the 2nd page differs at 7


def test_eviction_takes_the_least_recently_used_unlocked_leaf_and_spares_a_locked_path():
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.insert([1, 2, 4])
    tree.insert([5, 6])
    tree.match_prefix([5, 6])  # now the most recently used
    locked = tree.match_prefix([1, 2, 4]).node
    tree.lock(locked)
    assert tree.protected_tokens == 3 and tree.evictable_tokens == 3
    evicted = []
    assert tree.evict(1, lambda values: evicted.append(len(values))) == 1  # (3,): the oldest free leaf
    assert sorted(tree.sequences()) == [(1, 2, 4), (5, 6)] and evicted == [1]
    assert tree.evict(100) == 2  # only (5, 6) may go
    assert tree.sequences() == [(1, 2, 4)]
    tree.unlock(locked)
    assert tree.evict(100) == 3 and tree.num_tokens == 0  # the leaf (4,), then its parent (1, 2)
    with pytest.raises(KVLibError, match="unlock"):
        tree.unlock(locked)


@pytest.mark.parametrize("bad", ["abc", [1, -2], [1.5], None])
def test_bad_tokens_are_one_line_errors(bad):
    with pytest.raises(KVLibError):
        RadixTree().insert(bad)
    with pytest.raises(KVLibError):
        RadixTree(page_size=0)


SEQS = st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=14), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(stored=SEQS, query=st.lists(st.integers(0, 2), max_size=14), page_size=st.sampled_from([1, 2, 4]))
def test_matched_length_is_the_longest_common_prefix_rounded_down_to_a_page(stored, query, page_size):
    tree = RadixTree(page_size)
    kept = []
    for seq in stored:
        tree.insert(seq)
        kept.append(seq[: len(seq) // page_size * page_size])  # whole pages only are stored
    best = max(lcp(seq, query) for seq in kept)
    assert tree.match_prefix(query).num_tokens == best // page_size * page_size
    if page_size == 1:  # every distinct prefix is stored once
        assert tree.num_tokens == len({tuple(s[:n]) for s in kept for n in range(1, len(s) + 1)})


@settings(max_examples=150, deadline=None)
@given(stored=SEQS, locks=st.lists(st.integers(0, 7), max_size=4), budget=st.integers(0, 40))
def test_eviction_never_removes_a_locked_node(stored, locks, budget):
    tree = RadixTree()
    for seq in stored:
        tree.insert(seq)
    held = [tree.match_prefix(stored[i % len(stored)]) for i in locks]
    for match in held:
        tree.lock(match.node)
    before = tree.num_tokens
    removed = tree.evict(budget)
    assert tree.num_tokens == before - removed
    for match in held:  # every locked prefix is still stored whole
        assert tree.match_prefix(list(_path(match.node))).num_tokens == len(_path(match.node))
    assert removed >= min(budget, before - tree.protected_tokens) or tree.evictable_tokens == 0
    for match in held:
        tree.unlock(match.node)
    assert tree.protected_tokens == 0


def _path(node):
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


# ---------------------------------------------------------------------- the block manager


def serve(manager, seq_id, tokens, num_new):
    """Allocate, mark computed, append ``num_new`` tokens, free; returns the allocation."""
    tokens = list(tokens)
    allocation = manager.allocate(seq_id, tokens)
    manager.mark_computed(seq_id)
    for k in range(num_new):
        tokens.append(100 + k)
        assert manager.append_slot(seq_id) is not None
        manager.mark_computed(seq_id)
    manager.free(seq_id)
    return allocation


def test_same_hits_as_the_hash_cache_when_pages_are_blocks_and_nothing_is_evicted():
    prompts = [list(range(40)), list(range(35)) + [7, 7], list(range(20)) + [9] * 30, list(range(40))]
    radix, hashed = RadixBlockManager(64, 8), BlockManager(64, 8)
    for i, prompt in enumerate(prompts):
        assert serve(radix, i, prompt, 3).num_cached_tokens == serve(hashed, i, prompt, 3).num_cached_tokens
    assert radix.num_hit_tokens == 0 + 32 + 16 + 32  # whole blocks of 8 of each prompt but its last token
    token_level = RadixBlockManager(512, 1)
    hits = [serve(token_level, i, p, 3).num_cached_tokens for i, p in enumerate(prompts)]
    assert hits == [0, 35, 20, 39]  # mid-block branch points and the last token (always computed)


def test_a_full_pool_evicts_free_leaves_and_a_running_prefix_is_kept():
    manager = RadixBlockManager(6, 4)
    serve(manager, 0, list(range(12)), 1)  # 3 full blocks stored in the tree
    assert manager.tree.num_tokens == 12 and manager.num_free_blocks == 6
    runner = list(range(8)) + [50, 51, 52]  # hits 2 blocks, locks them
    assert manager.allocate(1, runner).num_cached_tokens == 8
    assert manager.num_free_blocks == 6 - 3  # 2 locked blocks and its new one are used
    other = [60] * 12  # needs 3 blocks: the free leaf (8..11) is evicted, the locked path is not
    assert manager.allocate(2, other) is not None
    assert manager.tree.match_prefix(list(range(12))).num_tokens == 8
    assert manager.allocate(3, [70] * 5) is None  # nothing left to evict
    for block in manager.pool.blocks:
        assert block.ref_cnt >= 0
    manager.free(1)
    manager.free(2)
    assert manager.num_free_blocks == 6 and manager.pool.num_free_blocks + manager.tree.num_tokens // 4 == 6


def test_tokens_through_the_tree_equal_the_contiguous_cache():
    torch.manual_seed(0)
    model = TinyLlama(
        ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1, d_ff=64)
    )
    cache = radix_paged_cache(model, 16, 4)
    history = torch.randint(0, 64, (13,)).tolist()
    for turn in range(3):
        tokens = list(history)
        allocation = cache.manager.allocate(turn, tokens)
        assert (allocation.num_cached_tokens > 0) == (turn > 0)
        tokens.append(int(prefill(model, cache, turn, tokens, allocation.num_cached_tokens).argmax()))
        for _ in range(4):
            tokens.append(greedy_step(model, cache, [turn], [tokens])[0])
        cache.manager.free(turn)
        assert tokens[len(history) :] == solo_tokens(model, Request(0, 0.0, tuple(history), 5))
        history = tokens + [turn + 1, turn + 2]


def test_a_running_sequence_shares_its_computed_blocks_and_keeps_them_locked():
    manager = RadixBlockManager(16, 4)
    first = list(range(10))
    manager.allocate(0, first)
    assert manager.allocate(9, list(range(10)) + [1]).num_cached_tokens == 0  # nothing computed yet
    manager.free(9)
    manager.mark_computed(0)  # the prefill ran: 2 full blocks are in the tree, locked by sequence 0
    assert manager.tree.num_tokens == 8 and manager.tree.protected_tokens == 8
    assert manager.allocate(1, list(range(10)) + [77]).num_cached_tokens == 8  # shared while 0 runs
    assert manager.tree.evict(100) == 0  # both hold the path
    manager.free(0)
    manager.free(1)
    assert manager.tree.protected_tokens == 0 and manager.num_free_blocks == 16
