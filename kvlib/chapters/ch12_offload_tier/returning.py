"""A returning conversation with and without the offload tier (chapter 12): measured on this CPU.

A conversation's first turn is served, other conversations then fill the device pool and evict its
blocks, and the conversation comes back with its history plus a new message. Without a tier its
history is prefilled again; with :class:`~kvlib.paged.offload_tier.OffloadingCache` the evicted
blocks were saved to the CPU tier (or to disk), and they are copied back instead. Every turn runs on
the real engine's cache and steps (:class:`~kvlib.paged.paged_cache.PagedKVCache`,
:func:`kvlib.paged.decode_loop.prefill` and :func:`~kvlib.paged.decode_loop.greedy_step`, what
:func:`kvlib.serving.engine.execute` runs), with prefix caching on, on the CPU and one thread, the
model chapter 4's engine serves. :func:`measure_ttft` times the returning turn's first token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.chapters.ch04_serving.policy_comparison import engine_model
from kvlib.measure.timing import Timing, one_cpu_thread, time_interleaved
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import greedy_step, prefill
from kvlib.paged.offload_tier import CPUTier, DiskTier, OffloadingCache, TieredAllocation, TieredStore
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.engine import solo_tokens
from kvlib.serving.traces import Request

DEVICE_BLOCK_SIZE = 16  # vLLM's default block size
NUM_DEVICE_BLOCKS = 64  # the device pool: 1,024 slots, room for one long conversation at a time
HISTORY_LEN = 896  # the first turn's prompt (a long system prompt and earlier turns)
MESSAGE_LEN = 32  # the returning turn's new message
NUM_NEW_PER_TURN = 8  # tokens generated each turn
NUM_OTHERS = 2  # conversations served in between, each as long as the first turn
CPU_TIER_BLOCKS = 1024  # a CPU tier large enough for everything evicted here
SMALL_CPU_BLOCKS = 16  # a CPU tier too small for the history: the rest spills to disk
STORES = ("none", "cpu", "cpu+disk")  # no tier; a large CPU tier; a small CPU tier over a disk tier


def cpu_model() -> TinyLlama:
    """Chapter 4's engine model, seeded, on the CPU: the measurement is this CPU's, whatever GPU is here."""
    torch.manual_seed(0)
    return engine_model(torch.device("cpu"))


def make_store(kind: str, cache: PagedKVCache) -> TieredStore | None:
    """The store of one configuration of :data:`STORES`, sized in blocks of ``cache``."""
    if kind not in STORES:
        raise KVLibError(f"store must be one of {', '.join(STORES)}, not {kind!r}")
    if kind == "none":
        return None
    if kind == "cpu":
        return TieredStore(CPUTier(CPU_TIER_BLOCKS * cache.bytes_per_block))
    return TieredStore(CPUTier(SMALL_CPU_BLOCKS * cache.bytes_per_block), DiskTier(1 << 30))


def serve_turn(
    model: TinyLlama, offload: OffloadingCache, seq_id: int, tokens: list[int], num_new: int
) -> tuple[list[int], TieredAllocation]:
    """Serve one turn: allocate (device hits, then the store's), prefill the rest, decode greedily
    ``num_new`` tokens (appended to ``tokens``), free. Returns the new tokens and the allocation."""
    cache, num_prompt = offload.cache, len(tokens)
    allocation = offload.allocate(seq_id, tokens)
    if allocation is None:
        raise KVLibError(f"the pool of {cache.manager.num_blocks} blocks cannot hold {num_prompt} tokens")
    tokens.append(int(prefill(model, cache, seq_id, tokens, allocation.num_cached_tokens).argmax()))
    for _ in range(num_new - 1):
        if offload.append_slot(seq_id) is None:
            raise KVLibError(f"the pool of {cache.manager.num_blocks} blocks is full")
        tokens.append(greedy_step(model, cache, [seq_id], [tokens], append_slots=False)[0])
    offload.free(seq_id)
    return tokens[num_prompt:], allocation


def conversation_prompts(vocab_size: int) -> tuple[list[int], list[list[int]], list[int]]:
    """Seeded token ids: the first turn's prompt, the other conversations' prompts, the new message."""
    generator = torch.Generator().manual_seed(12)

    def draw(n: int) -> list[int]:
        return torch.randint(0, vocab_size, (n,), generator=generator).tolist()

    return draw(HISTORY_LEN), [draw(HISTORY_LEN) for _ in range(NUM_OTHERS)], draw(MESSAGE_LEN)


@dataclass(frozen=True)
class ReturningRun:
    """One returning conversation under one store."""

    store: str
    returning_prompt: tuple[int, ...]  # the second turn's prompt: history, first answer, new message
    generated: tuple[int, ...]  # the second turn's tokens
    allocation: TieredAllocation  # where the second turn's cached tokens came from
    num_saved: int  # blocks saved to the store on eviction (0 without one)
    num_spilled: int  # of them, blocks the CPU tier passed on to disk


@torch.inference_mode()
def returning_conversation(model: TinyLlama, store_kind: str) -> ReturningRun:
    """Turn 1 of a conversation, :data:`NUM_OTHERS` other conversations, then turn 2 of the first."""
    cache = PagedKVCache.for_model(model, NUM_DEVICE_BLOCKS, DEVICE_BLOCK_SIZE)
    store = make_store(store_kind, cache)
    offload = OffloadingCache(cache, store)
    history, others, message = conversation_prompts(model.config.vocab_size)
    try:
        with one_cpu_thread(cache.k.device):
            turn = list(history)
            serve_turn(model, offload, 0, turn, NUM_NEW_PER_TURN)
            for seq_id, other in enumerate(others, start=1):
                serve_turn(model, offload, seq_id, list(other), NUM_NEW_PER_TURN)
            prompt = turn + message
            generated, allocation = serve_turn(model, offload, NUM_OTHERS + 1, list(prompt), NUM_NEW_PER_TURN)
    finally:
        if store is not None:
            store.close()
    counts = store.counts if store is not None else None
    return ReturningRun(
        store_kind,
        tuple(prompt),
        tuple(generated),
        allocation,
        0 if counts is None else counts.saved,
        0 if counts is None else counts.spilled,
    )


def returning_tokens_identical(runs: list[ReturningRun], model: TinyLlama) -> bool:
    """Did every store's returning turn generate the same tokens, and those of the prompt served alone on
    chapter 1's contiguous cache (:func:`~kvlib.serving.engine.solo_tokens`)?"""
    solo = solo_tokens(model, Request(0, 0.0, runs[0].returning_prompt, NUM_NEW_PER_TURN))
    return all(list(run.generated) == solo for run in runs)


def measure_ttft(model: TinyLlama, store_kinds=STORES, rounds: int = 7) -> dict[str, Timing]:
    """Seconds to the returning turn's first token under each store (allocate, load, prefill, argmax),
    on this thread's CPU clock, the stores' samples interleaved (:func:`kvlib.measure.time_interleaved`).

    Each call evicts the turn's blocks from the device pool afterwards
    (:meth:`~kvlib.paged.offload_tier.OffloadingCache.evict`), so that every call misses the device
    and either recomputes the history (no store) or loads it from the store."""
    history, _, message = conversation_prompts(model.config.vocab_size)
    prompt = history + message
    calls, stores = {}, []
    for kind in store_kinds:
        cache = PagedKVCache.for_model(model, NUM_DEVICE_BLOCKS, DEVICE_BLOCK_SIZE)
        store = make_store(kind, cache)
        stores.append(store)
        offload = OffloadingCache(cache, store)
        if kind == "cpu+disk":  # every block on disk: the CPU tier's room is given to nothing
            store.cpu = None
        calls[kind] = _first_token(model, offload, prompt)
        calls[kind]()  # the first call computes the history and saves it on eviction
    try:
        with one_cpu_thread(torch.device("cpu")):
            return time_interleaved(calls, rounds, number=1, clock="thread")
    finally:
        for store in stores:
            if store is not None:
                store.close()


def _first_token(model: TinyLlama, offload: OffloadingCache, prompt: list[int]):
    """A call that serves ``prompt`` to its first token, then evicts its blocks from the device pool."""

    @torch.inference_mode()
    def call() -> int:
        tokens = list(prompt)
        allocation = offload.allocate(0, tokens)
        token = int(prefill(model, offload.cache, 0, tokens, allocation.num_cached_tokens).argmax())
        offload.evict(0)
        return token

    return call
