"""A radix tree beside the hash prefix cache (chapter 11): hit rates at equal capacity, and tokens.

:func:`replay` serves a trace's turns one after another through a block manager, counting the
prompt tokens its prefix cache held: the hash cache of chapter 3
(:class:`~kvlib.paged.block_manager.BlockManager`) or the radix tree
(:class:`~kvlib.paged.radix_cache.RadixBlockManager`), in pages of a block or of one token, each
with the same slots. :func:`small_cases` shows where they agree and where they part, on three
pairs of prompts. :func:`engine_conversations` serves conversations on chapter 4's engine model
through the tree-backed paged cache and compares every turn's tokens with the turn served alone on
chapter 1's contiguous cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.chapters.ch11_radix_routing.traces import Turn, conversations
from kvlib.checks import require_int
from kvlib.measure.timing import one_cpu_thread
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.decode_loop import greedy_step, prefill
from kvlib.paged.radix_cache import RadixBlockManager, radix_paged_cache
from kvlib.serving.engine import solo_tokens
from kvlib.serving.traces import Request

CACHE_BLOCK_SIZE = 16  # vLLM's default block size
CACHES = ("hash, blocks of 16", "radix, pages of 16", "radix, pages of 1")
CAPACITIES = (1024, 2048, 4096, 8192, 32768)  # token slots of each cache (equal for all three)
BENCH_SLOTS = 2048  # the capacity the bench reports


def make_manager(kind: str, num_slots: int) -> BlockManager:
    """A block manager of one of :data:`CACHES` over ``num_slots`` token slots."""
    num_slots = require_int(num_slots, "num_slots", CACHE_BLOCK_SIZE)
    if kind == CACHES[0]:
        return BlockManager(num_slots // CACHE_BLOCK_SIZE, CACHE_BLOCK_SIZE, enable_prefix_caching=True)
    if kind == CACHES[1]:
        return RadixBlockManager(num_slots // CACHE_BLOCK_SIZE, CACHE_BLOCK_SIZE)
    if kind == CACHES[2]:
        return RadixBlockManager(num_slots, 1)
    raise KVLibError(f"cache must be one of {', '.join(CACHES)}, not {kind!r}")


@dataclass(frozen=True)
class Replay:
    """Prompt tokens served, and those the prefix cache held, per turn."""

    hits: tuple[int, ...]
    prompt_lens: tuple[int, ...]

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens over all prompt tokens."""
        return sum(self.hits) / sum(self.prompt_lens)


def replay(manager: BlockManager, trace: Sequence[Turn]) -> Replay:
    """Serve each turn in order: allocate its prompt (hits counted), give its answer's tokens slots
    (all but the last, whose K/V no step computes), free it (its blocks stay cached)."""
    hits, lens = [], []
    for seq_id, turn in enumerate(trace):
        tokens = list(turn.prompt)
        allocation = manager.allocate(seq_id, tokens)
        if allocation is None:
            raise KVLibError(f"a cache of {manager.num_blocks} blocks cannot hold a prompt of {len(tokens)}")
        manager.mark_computed(seq_id)
        for token in turn.answer[:-1]:
            tokens.append(token)
            if manager.append_slot(seq_id) is None:
                raise KVLibError(
                    f"a cache of {manager.num_blocks} blocks cannot hold a turn of {len(tokens)}"
                )
            manager.mark_computed(seq_id)
        manager.free(seq_id)
        hits.append(allocation.num_cached_tokens)
        lens.append(len(turn.prompt))
    return Replay(tuple(hits), tuple(lens))


def hit_rate_rows(trace: Sequence[Turn], capacities=CAPACITIES) -> list[dict]:
    """One row per capacity: each cache's hit rate on ``trace``."""
    return [
        {"slots": slots, **{kind: replay(make_manager(kind, slots), trace).hit_rate for kind in CACHES}}
        for slots in capacities
    ]


def _ids(start: int, n: int) -> tuple[int, ...]:
    return tuple(range(start, start + n))


# Three pairs of turns: (first prompt, first answer, second prompt), lengths chosen to show each case
SMALL_CASES = {
    "a shared prefix of 64 tokens, block-aligned": (
        _ids(1, 64) + _ids(200, 9),
        (7,),
        _ids(1, 64) + _ids(300, 9),
    ),
    "a branch after 40 tokens, mid-block": (_ids(1, 40) + _ids(200, 24), (7,), _ids(1, 40) + _ids(300, 24)),
    "the previous turn's partial last block": (
        _ids(1, 50),
        _ids(100, 11),
        _ids(1, 50) + _ids(100, 11) + _ids(300, 20),
    ),
}


def small_cases() -> list[dict]:
    """The second prompt's cached tokens under each cache, for each of :data:`SMALL_CASES` (ample slots)."""
    rows = []
    for case, (first, answer, second) in SMALL_CASES.items():
        trace = [Turn(0, 0, first, answer), Turn(0, 1, second, (7,))]
        row = {"case": case, "second prompt": len(second)}
        row |= {kind: replay(make_manager(kind, 4096), trace).hits[1] for kind in CACHES}
        rows.append(row)
    return rows


# ---------------------------------------------------------------------- the engine model's tokens

ENGINE_CONVERSATIONS = 3
ENGINE_TURNS = 3
ENGINE_NUM_NEW = 8  # tokens generated each turn
ENGINE_BLOCKS = 24  # blocks of 16 in the pool: 384 slots, so that later turns evict earlier ones


@dataclass(frozen=True)
class EngineRun:
    """Conversations served through the tree-backed paged cache."""

    block_size: int
    tokens_identical: bool  # every turn's tokens equal the turn served alone on the contiguous cache
    num_hit_tokens: int
    num_prompt_tokens: int
    num_evicted_tokens: int  # tokens the tree evicted to make room

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens over all prompt tokens."""
        return self.num_hit_tokens / self.num_prompt_tokens


@torch.inference_mode()
def engine_conversations(model: TinyLlama, block_size: int = CACHE_BLOCK_SIZE) -> EngineRun:
    """Serve :data:`ENGINE_CONVERSATIONS` conversations of :data:`ENGINE_TURNS` turns, interleaved by turn,
    through :func:`~kvlib.paged.radix_cache.radix_paged_cache` (prefill past the tree's hits, then
    greedy decode), each turn's prompt its history, its generated tokens and the next message of
    :func:`~kvlib.chapters.ch11_radix_routing.traces.conversations`; on the CPU, one thread."""
    block_size = require_int(block_size, "block_size")
    cache = radix_paged_cache(model, ENGINE_BLOCKS * CACHE_BLOCK_SIZE // block_size, block_size)
    manager = cache.manager
    convs = conversations(ENGINE_CONVERSATIONS, ENGINE_TURNS, seed=1)
    histories: list[list[int]] = [[] for _ in convs]
    same, seq_id = True, 0
    with one_cpu_thread(cache.k.device):
        for k in range(ENGINE_TURNS):
            for c, turns in enumerate(convs):
                start = len(turns[k - 1].prompt) + len(turns[k - 1].answer) if k else 0
                prompt = histories[c] + list(turns[k].prompt[start:])
                tokens = list(prompt)
                allocation = manager.allocate(seq_id, tokens)
                if allocation is None:
                    raise KVLibError(
                        f"the pool of {manager.num_blocks} blocks cannot hold {len(tokens)} tokens"
                    )
                tokens.append(
                    int(prefill(model, cache, seq_id, tokens, allocation.num_cached_tokens).argmax())
                )
                for _ in range(ENGINE_NUM_NEW - 1):
                    tokens.append(greedy_step(model, cache, [seq_id], [tokens])[0])
                manager.free(seq_id)
                same &= tokens[len(prompt) :] == solo_tokens(
                    model, Request(0, 0.0, tuple(prompt), ENGINE_NUM_NEW)
                )
                histories[c] = tokens
                seq_id += 1
    return EngineRun(
        block_size, same, manager.num_hit_tokens, manager.num_lookup_tokens, manager.tree.num_evicted_tokens
    )


def hash_evictions(trace: Sequence[Turn], num_slots: int = BENCH_SLOTS) -> tuple[int, int]:
    """Replay ``trace`` on the hash cache; returns (cached blocks evicted, of them while an empty block
    waited behind them in the free queue). The pool takes blocks from the queue's front, whatever they
    hold, so a block freed without a hash (a partial last block, a duplicate) stays unused at the back
    while a cached block ahead of it is overwritten; the tree evicts only when no block is free."""
    manager = make_manager(CACHES[0], num_slots)
    pool, take = manager.pool, manager.pool.get_new_blocks
    counts = [0, 0]

    def counting_take(num: int):
        ids = pool.free_queue.block_ids()
        empty_behind = any(pool.blocks[b].block_hash is None for b in ids[num:])
        cached = sum(1 for b in ids[:num] if pool.blocks[b].block_hash is not None)
        counts[0] += cached
        counts[1] += cached if empty_behind else 0
        return take(num)

    pool.get_new_blocks = counting_take  # an instrument on this one pool, for this replay only
    replay(manager, trace)
    return counts[0], counts[1]
