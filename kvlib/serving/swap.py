"""Swapping, the second way to preempt a request (chapter 8): its K/V copied out to host memory and back.

When the KV budget runs out, the scheduler of :mod:`kvlib.serving.scheduler` preempts its
youngest request. Chapter 4 recomputes it: its blocks are freed and its prompt and
generated tokens prefilled again later. The vLLM paper offers a second mode (Kwon et al.
2023, Section 4.5; vLLM's ``--swap-space``, ``--preemption-mode swap``): copy the
request's K/V blocks to CPU memory, free its device blocks, and copy them back into new
blocks when it resumes. Recomputation pays FLOPs, swapping pays link bytes:

- :class:`HostPool`: the host's blocks. Without a cache it only counts them (the
  simulator); with a :class:`~kvlib.paged.paged_cache.PagedKVCache` it holds them in a CPU
  tensor shaped like the cache's pools (pinned memory when the cache is on a GPU, so that
  copies run at the link's speed) and copies block by block. When it is full the
  scheduler falls back to recomputation.
- :class:`SwapTimeModel`: seconds of one copy, ``per_transfer_s + tokens x bytes_per_token /
  bandwidth``; :func:`kvlib.chapters.ch08_serving_engines.swap_analysis.a100_swap_model` states the A100's
  link.
- :class:`BlockCopyModel` (chapter 12): the same copy counted in calls, as engines issue them: one
  call per block, per layer, for K and for V (``blocks x layers x 2`` calls, vLLM's per-block swap
  that the paper measured slow at small block sizes), or one gathered call per layer for K and for V
  (``layers x 2``, :class:`HostPool`'s way); each call costs ``per_call_s`` besides its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import require_int, require_real
from kvlib.paged.block_manager import num_blocks_for
from kvlib.paged.paged_cache import PagedKVCache


@dataclass(frozen=True)
class SwapTimeModel:
    """Seconds of one copy of a request's K/V between device and host: a fixed part plus bytes / bandwidth."""

    bytes_per_token: int  # K/V bytes of one token, over all layers
    bandwidth: float  # bytes per second the host link achieves (one direction)
    per_transfer_s: float = 0.0  # seconds every copy costs whatever its size (launches, latency)
    source: str = ""  # where the numbers come from (a data sheet, a measurement)

    def __post_init__(self):
        require_int(self.bytes_per_token, "SwapTimeModel.bytes_per_token")
        require_real(self.bandwidth, "SwapTimeModel.bandwidth (bytes/s)", positive=True)
        require_real(self.per_transfer_s, "SwapTimeModel.per_transfer_s (seconds)")

    def transfer_s(self, num_tokens: int) -> float:
        """Seconds to copy ``num_tokens`` tokens' K/V one way (out to the host, or back in)."""
        require_int(num_tokens, "num_tokens", 0)
        return self.per_transfer_s + num_tokens * self.bytes_per_token / self.bandwidth

    def step_s(self, swaps: tuple[int, ...]) -> float:
        """Seconds of a step's copies, one per entry of ``swaps`` (tokens each), made one after another."""
        if not isinstance(swaps, tuple | list):
            raise KVLibError(f"swaps must be a tuple of token counts, not {type(swaps).__name__}")
        return sum(self.transfer_s(n) for n in swaps)


@dataclass(frozen=True)
class BlockCopyModel:
    """Seconds of one copy of a request's K/V, counted in copy calls (chapter 12).

    ``per_block``: one call per block, per layer, for K and for V, as vLLM's first swap did
    (``cache_ops.swap_blocks`` over a block mapping); the calls grow with the request, so their cost
    is a per-token slope, ``2 x num_layers x per_call_s / block_size``. Otherwise one call per layer
    for K and for V over all the request's blocks (gathered, as :class:`HostPool` copies): a fixed
    ``2 x num_layers x per_call_s`` whatever the length.
    """

    bytes_per_token: int  # K/V bytes of one token, over all layers
    num_layers: int
    block_size: int
    bandwidth: float  # bytes per second the link achieves on large copies (one direction)
    per_call_s: float  # seconds one copy call costs besides its bytes (launch, completion)
    per_block: bool = True

    def __post_init__(self):
        require_int(self.bytes_per_token, "BlockCopyModel.bytes_per_token")
        require_int(self.num_layers, "BlockCopyModel.num_layers")
        require_int(self.block_size, "BlockCopyModel.block_size")
        require_real(self.bandwidth, "BlockCopyModel.bandwidth (bytes/s)", positive=True)
        require_real(self.per_call_s, "BlockCopyModel.per_call_s (seconds)")
        if not isinstance(self.per_block, bool):
            raise KVLibError(f"BlockCopyModel.per_block must be True or False, not {self.per_block!r}")

    def num_calls(self, num_tokens: int) -> int:
        """Copy calls one copy of ``num_tokens`` tokens' K/V issues (one way)."""
        num_tokens = require_int(num_tokens, "num_tokens", 0)
        per_layer = num_blocks_for(num_tokens, self.block_size) if self.per_block else min(num_tokens, 1)
        return 2 * self.num_layers * per_layer

    def transfer_s(self, num_tokens: int) -> float:
        """Seconds to copy ``num_tokens`` tokens' K/V one way: its calls, then its bytes at ``bandwidth``
        (whole blocks: a partly filled last block is copied whole)."""
        num_tokens = require_int(num_tokens, "num_tokens", 0)
        num_slots = num_blocks_for(num_tokens, self.block_size) * self.block_size
        return (
            self.num_calls(num_tokens) * self.per_call_s + num_slots * self.bytes_per_token / self.bandwidth
        )

    @property
    def fixed_s(self) -> float:
        """The part of :meth:`transfer_s` that does not grow with the length (the line's intercept)."""
        return 0.0 if self.per_block else 2 * self.num_layers * self.per_call_s

    @property
    def per_token_s(self) -> float:
        """Seconds each token adds (the line's slope, exact at whole blocks): bytes, plus per-block calls."""
        calls = 2 * self.num_layers * self.per_call_s / self.block_size if self.per_block else 0.0
        return self.bytes_per_token / self.bandwidth + calls

    def effective_bandwidth(self, num_tokens: int) -> float:
        """Bytes of the request's K/V over the seconds of their copy: what the link seems to achieve."""
        num_tokens = require_int(num_tokens, "num_tokens")
        return num_tokens * self.bytes_per_token / self.transfer_s(num_tokens)


MAX_HOST_BLOCKS = 10_000_000  # blocks of a host pool: 10**7 blocks of 16 tokens are 160 M tokens


class HostPool:
    """``num_blocks`` blocks of host memory that swapped-out requests keep their K/V in.

    ``cache``: the device cache whose blocks are copied (the real engine); ``None`` counts
    blocks only (the simulator). A request's host blocks are freed when it is swapped in.
    """

    def __init__(self, num_blocks: int, block_size: int, cache: PagedKVCache | None = None):
        # its free list holds one id per block: 10**12 would not fit in memory (vLLM's --swap-space is GiB)
        self.num_blocks = require_int(num_blocks, "the host pool's num_blocks", 1, MAX_HOST_BLOCKS)
        self.block_size = require_int(block_size, "the host pool's block_size")
        if cache is not None and not isinstance(cache, PagedKVCache):
            raise KVLibError(f"cache must be a PagedKVCache or None, not {type(cache).__name__}")
        if cache is not None and cache.block_size != block_size:
            raise KVLibError(
                f"the host pool's block_size {block_size} differs from the cache's {cache.block_size}"
            )
        self.cache = cache
        self._free = list(range(num_blocks - 1, -1, -1))  # host block ids, the lowest taken first
        self.held: dict[int, tuple[list[int], int]] = {}  # seq_id -> (its host blocks, tokens they hold)
        self.num_swap_outs = 0  # copies to the host so far
        self.num_swap_ins = 0  # copies back so far
        if cache is not None:
            shape = (cache.k.shape[0], num_blocks, *cache.k.shape[2:])  # (layers, blocks, block_size, h, hd)
            pin = cache.k.device.type == "cuda"  # page-locked: the GPU copies it by DMA at the link's speed
            self.k = torch.zeros(shape, dtype=cache.k.dtype, pin_memory=pin)
            self.v = torch.zeros(shape, dtype=cache.k.dtype, pin_memory=pin)

    @property
    def num_free_blocks(self) -> int:
        """Host blocks no swapped-out request holds."""
        return len(self._free)

    def holds(self, seq_id: int) -> bool:
        """Is this sequence swapped out here?"""
        return seq_id in self.held

    def swap_out(self, seq_id: int, num_tokens: int) -> bool:
        """Copy the K/V of the sequence's first ``num_tokens`` tokens to host blocks; ``False`` if they do
        not fit (nothing changes: the scheduler recomputes the request instead).

        Call it before the device blocks are freed: it reads them through the cache's manager.
        """
        num_tokens = require_int(num_tokens, "the tokens to swap out")
        if seq_id in self.held:
            raise KVLibError(f"sequence {seq_id} is already swapped out")
        need = num_blocks_for(num_tokens, self.block_size)
        if need > len(self._free):
            return False
        if self.cache is not None:
            device = self.cache.manager.block_table(seq_id)[:need]
            if len(device) < need or self.cache.manager.num_computed(seq_id) < num_tokens:
                raise KVLibError(f"sequence {seq_id} has no K/V for {num_tokens} tokens to swap out")
        host = [self._free.pop() for _ in range(need)]
        if self.cache is not None:
            self._copy(self.cache.k, device, self.k, host)
            self._copy(self.cache.v, device, self.v, host)
        self.held[seq_id] = (host, num_tokens)
        self.num_swap_outs += 1
        return True

    def swap_in(self, seq_id: int, num_cached: int = 0) -> int:
        """Copy a swapped-out sequence's K/V back into its new device blocks (already allocated);
        returns how many tokens it restored. Its host blocks are free again.

        ``num_cached``: leading tokens the device's prefix cache already held when the blocks were
        allocated; their blocks (shared) are not written.
        """
        if seq_id not in self.held:
            raise KVLibError(f"sequence {seq_id} is not swapped out")
        host, num_tokens = self.held.pop(seq_id)
        if self.cache is not None:
            manager = self.cache.manager
            device = manager.block_table(seq_id)[: len(host)]
            if len(device) < len(host):
                raise KVLibError(
                    f"sequence {seq_id} has too few device blocks to swap in {num_tokens} tokens"
                )
            skip = num_cached // self.block_size  # shared blocks already hold these K/V
            self._copy(self.k, host[skip:], self.cache.k, device[skip:])
            self._copy(self.v, host[skip:], self.cache.v, device[skip:])
            manager.mark_computed(seq_id, max(num_tokens, manager.num_computed(seq_id)))
        self._free.extend(reversed(host))
        self.num_swap_ins += 1
        return num_tokens

    @staticmethod
    def _copy(src: torch.Tensor, src_blocks: list[int], dst: torch.Tensor, dst_blocks: list[int]) -> None:
        """Copy blocks ``src[:, src_blocks]`` into ``dst[:, dst_blocks]`` in every layer, across devices."""
        if not src_blocks:
            return
        picked = src.index_select(1, torch.tensor(src_blocks, device=src.device))  # (layers, n, bs, h, hd)
        dst.index_copy_(1, torch.tensor(dst_blocks, device=dst.device), picked.to(dst.device))
