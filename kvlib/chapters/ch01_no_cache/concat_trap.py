"""Chapter 1's measurement of the concatenation trap: what a cache grown by ``torch.cat`` copies.

:func:`concat_trap` times one decode step's cache work (store one token's K and V in every
layer and attend) in a preallocated :class:`~kvlib.cache.fast_contiguous.FastContiguousKVCache` and in a
:class:`~kvlib.cache.contiguous.ConcatKVCache` holding the same tokens, at each of
:func:`trap_lengths`: up to a cache larger than four times the last-level cache
(:func:`~kvlib.measure.hardware.dram_size`), so that its longest point measures copies from
DRAM, as a real model's would be. The two caches take turns by
:func:`~kvlib.measure.timing.time_interleaved`, the one protocol by which the chapter
compares two functions. :func:`filled_cache` fills a cache to a length without a prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import ConcatKVCache, kv_bytes_per_token
from kvlib.cache.fast_contiguous import FastContiguousKVCache
from kvlib.measure.hardware import dram_size, llc_bytes
from kvlib.measure.timing import Timing, time_interleaved
from kvlib.model.config import ModelConfig


def trap_lengths(
    config: ModelConfig, batch: int, device=None, start: int = 256, factor: int = 4
) -> tuple[int, ...]:
    """Cache lengths for :func:`concat_trap`: ``start``, ``start`` x ``factor``, ..., up to the first
    length whose cache (K and V of every layer, float32, the whole batch) reaches
    :func:`~kvlib.measure.hardware.dram_bytes` (four times the last-level cache, or more), so that the
    last point copies from DRAM on any machine. When available memory caps
    ``dram_bytes``, the last length is the cap's (the chapter reports it)."""
    per_position = batch * kv_bytes_per_token(config)
    target = dram_size(device).num_bytes
    lengths = [start]
    while lengths[-1] * per_position < target:
        lengths.append(lengths[-1] * factor)
    return tuple(lengths)


@dataclass(frozen=True)
class TrapPoint:
    """One cache length of :func:`concat_trap`: the time of one decode step's cache work each way."""

    length: int  # tokens already in the cache
    preallocated: Timing  # prepare + attend of every layer, FastContiguousKVCache (the benchmarks' own)
    concat: Timing  # the same with ConcatKVCache
    bytes_copied: int  # bytes the concatenating cache copied in one step (its own count)

    @property
    def ratio(self) -> float:
        """How many times longer the concatenating cache's step takes (medians)."""
        return self.concat.median_s / self.preallocated.median_s


def filled_cache(kind: str, config: ModelConfig, batch: int, length: int, spare: int = 0, device=None):
    """A ``"cache"`` (preallocated, ``spare`` slots free) or ``"concat"`` cache of ``length`` random tokens.

    It is filled the cheap way: one call per layer stores all the keys and values while a
    single dummy query attends to them, instead of a prefill's length x length attention.
    The keys and values repeat a seeded random block of up to 4,096 positions: drawing
    gigabytes of random numbers would take longer than the measurement, and the timing of
    a copy or an attention does not depend on the values.
    """
    if kind not in ("cache", "concat"):
        raise KVLibError(f"kind must be 'cache' or 'concat', not {kind!r}")
    cache = (
        FastContiguousKVCache(config, batch, length + spare, device=device)
        if kind == "cache"
        else ConcatKVCache(config, device=device)
    )
    generator = torch.Generator(device=device).manual_seed(0)  # drawn where they are used
    cache.prepare(length)
    q = torch.zeros(batch, config.num_heads, 1, config.head_dim, device=device)  # (batch, heads, 1, head_dim)
    shape = (batch, config.num_kv_heads, length, config.head_dim)  # of each layer's K and V
    block_len = min(length, 4096)
    for layer in range(config.num_layers):
        k, v = (torch.empty(shape, device=device) for _ in "kv")
        for tensor in (k, v):
            # (batch, kv_heads, block_len, head_dim), repeated along the positions
            block = torch.randn(shape[:2] + (block_len, shape[3]), generator=generator, device=device)
            for start in range(0, length, block_len):
                tensor[:, :, start : start + block_len] = block[:, :, : length - start]
        cache.attend(layer, q, k, v)
    return cache


def concat_trap(
    config: ModelConfig, batch: int, lengths, device=None, repeats: int = 5, number: int = 4
) -> list[TrapPoint]:
    """Time one decode step's cache work (store a token's K, V and attend, in every layer) at each length.

    The model's projections and MLP cost the same either way and are left out; what is
    timed is what the two caches do differently. The two caches take turns
    (:func:`~kvlib.measure.timing.time_interleaved`), one sample each per round, ``repeats``
    rounds, so that both meet the same conditions. A sample is ``number`` steps while the cache fits in the
    last-level cache and one step beyond (one step then streams at least the cache from
    DRAM, long enough to time). Each step adds a token: a measurement at length L covers
    L+1 to L+1+repeats*number.
    """
    device = torch.device("cpu") if device is None else torch.device(device)
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(batch, config.num_heads, 1, config.head_dim, generator=generator).to(device)
    # one new token per step: q (batch, heads, 1, head_dim); k, v (batch, kv_heads, 1, head_dim)
    k, v = (
        torch.randn(batch, config.num_kv_heads, 1, config.head_dim, generator=generator).to(device)
        for _ in "kv"
    )
    llc = llc_bytes(device)

    def step(cache):
        cache.prepare(1)
        for layer in range(config.num_layers):
            cache.attend(layer, q, k, v)

    points = []
    for length in lengths:
        steps = number if length * batch * kv_bytes_per_token(config) <= llc else 1
        caches = {
            kind: filled_cache(kind, config, batch, length, spare=1 + repeats * steps, device=device)
            for kind in ("cache", "concat")
        }
        before = caches["concat"].bytes_copied
        for cache in caches.values():  # warm-up step; count what the concatenating cache copies in it
            step(cache)
        copied = caches["concat"].bytes_copied - before
        timings = time_interleaved(
            {kind: (lambda cache=cache: step(cache)) for kind, cache in caches.items()},
            rounds=repeats,
            number=steps,
            warmup=0,
            device=device,
        )
        points.append(TrapPoint(length, timings["cache"], timings["concat"], copied))
        del caches
    return points
