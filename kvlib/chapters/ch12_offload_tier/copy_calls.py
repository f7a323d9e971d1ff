"""Copy calls measured on this CPU (chapter 12): a request's blocks copied one call per block, per layer,
for K and for V, against one gathered call per layer for K and for V, between two pools shaped like the
engine's cache. What the per-block swap of :class:`~kvlib.serving.swap.BlockCopyModel` prices for a GPU,
here with torch calls on host memory: the bytes are the same, only the number of calls differs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib.checks import require_int
from kvlib.measure.timing import Timing, one_cpu_thread, time_interleaved
from kvlib.model.llama import TinyLlama
from kvlib.paged.paged_cache import PagedKVCache


@dataclass(frozen=True)
class CopyCallTimes:
    """Seconds of one copy of ``num_blocks`` blocks each way, and the calls each way issues."""

    num_blocks: int
    per_block: Timing
    per_layer: Timing
    num_per_block_calls: int  # blocks x layers x 2
    num_per_layer_calls: int  # layers x 2

    @property
    def per_call_s(self) -> float:
        """Seconds each extra call of the per-block copy costs (median against median)."""
        extra = self.num_per_block_calls - self.num_per_layer_calls
        return (self.per_block.median_s - self.per_layer.median_s) / extra


def measure_copy_calls(
    model: TinyLlama, num_blocks: int, block_size: int = 16, rounds: int = 7
) -> CopyCallTimes:
    """Copy the first ``num_blocks`` blocks of a paged cache shaped for ``model`` into a host pool, both
    ways, on one thread's CPU clock (:func:`kvlib.measure.time_interleaved`)."""
    num_blocks = require_int(num_blocks, "num_blocks")
    cache = PagedKVCache.for_model(model, num_blocks, block_size, enable_prefix_caching=False)
    host_k, host_v = torch.empty_like(cache.k), torch.empty_like(cache.v)  # (layers, blocks, bs, h, hd)
    blocks = list(range(num_blocks))
    index = torch.tensor(blocks)

    def per_block() -> None:
        for layer in range(cache.num_layers):
            for pool, host in ((cache.k, host_k), (cache.v, host_v)):
                for block in blocks:  # one call per block: vLLM's first swap_blocks
                    host[layer, block].copy_(pool[layer, block])

    def per_layer() -> None:
        for layer in range(cache.num_layers):
            for pool, host in ((cache.k, host_k), (cache.v, host_v)):
                host[layer].index_copy_(0, index, pool[layer].index_select(0, index))  # one gathered call

    with one_cpu_thread(torch.device("cpu")):
        times = time_interleaved({"per block": per_block, "per layer": per_layer}, rounds, clock="thread")
    num_layers = cache.num_layers
    return CopyCallTimes(
        num_blocks, times["per block"], times["per layer"], 2 * num_layers * num_blocks, 2 * num_layers
    )
