"""Measurements of chapter 3: paged vs contiguous attention (equality and time), the memory
that contiguous reservation wastes, and ``bench()`` for ``python -m kvlib bench``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from kvlib import KVLibError
from kvlib.attention import grouped_attention
from kvlib.measure import torch_threads
from kvlib.measure import pick_device, time_it
from kvlib.model import ModelConfig, TinyLlama
from kvlib.paged import BlockManager
from kvlib.paged_attention import GatherBuffer, generate_paged, paged_attention


@dataclass(frozen=True)
class DecodeCase:
    """A batch of sequences of different lengths stored both contiguously and in shuffled blocks."""

    q: torch.Tensor  # (batch, num_heads, num_new, head_dim)
    k: list[torch.Tensor]  # per sequence (1, num_kv_heads, seq_len, head_dim)
    v: list[torch.Tensor]
    k_cache: torch.Tensor  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # (batch, max_blocks)
    seq_lens: torch.Tensor  # (batch,)


def random_decode_case(
    seq_lens: Sequence[int], block_size: int, num_heads: int = 8, num_kv_heads: int = 2, head_dim: int = 16,
    num_new: int = 1, seed: int = 0, device=None, dtype=torch.float32,
) -> DecodeCase:
    """Random K/V for sequences of the given lengths, placed in randomly chosen (non-contiguous) blocks."""
    if num_new > min(seq_lens):
        raise KVLibError(f"num_new ({num_new}) exceeds the shortest sequence ({min(seq_lens)} tokens)")
    order_gen = torch.Generator().manual_seed(seed)  # block placement, the same on every device
    data_gen = torch.Generator(device=device).manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=data_gen, device=device, dtype=dtype)  # noqa: E731
    k = [randn(1, num_kv_heads, n, head_dim) for n in seq_lens]
    v = [randn(1, num_kv_heads, n, head_dim) for n in seq_lens]
    num_per_seq = [-(-n // block_size) for n in seq_lens]
    order = torch.randperm(sum(num_per_seq), generator=order_gen).tolist()  # physical block of each logical block
    k_cache = torch.zeros(len(order), block_size, num_kv_heads, head_dim, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    tables, first = [], 0
    for seq, count in enumerate(num_per_seq):
        table = order[first : first + count]
        first += count
        positions = torch.arange(seq_lens[seq])
        slots = (torch.tensor(table)[positions // block_size] * block_size + positions % block_size).to(device)
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = k[seq][0].transpose(0, 1)
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = v[seq][0].transpose(0, 1)
        tables.append(table + [0] * (max(num_per_seq) - count))
    q = randn(len(seq_lens), num_heads, num_new, head_dim)
    as_tensor = lambda x: torch.tensor(x, device=device)  # noqa: E731
    return DecodeCase(q, k, v, k_cache, v_cache, as_tensor(tables), as_tensor(list(seq_lens)))


def paged_vs_contiguous_error(case: DecodeCase) -> float:
    """Largest absolute difference between paged attention and contiguous attention, sequence by sequence."""
    paged = paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens)
    num_new = case.q.shape[2]
    worst = 0.0
    for seq, (k, v) in enumerate(zip(case.k, case.v)):
        reference = grouped_attention(case.q[seq : seq + 1], k, v, q_start=k.shape[2] - num_new)
        worst = max(worst, (paged[seq : seq + 1] - reference).abs().max().item())
    return worst


@dataclass(frozen=True)
class KernelSizes:
    """Decode-attention shapes for the timing of chapter 3, chosen per device.

    A CPU reads a few MiB of K/V per call in milliseconds; a GPU needs far larger
    batches and lengths before it is bound by memory rather than by kernel launches.
    """

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    lengths: tuple[int, ...]
    dtype: torch.dtype


def kernel_sizes(device) -> KernelSizes:
    if torch.device(device).type == "cuda":
        return KernelSizes(batch=32, num_heads=32, num_kv_heads=8, head_dim=128, lengths=(1024, 4096, 16384), dtype=torch.float16)
    return KernelSizes(batch=4, num_heads=16, num_kv_heads=4, head_dim=64, lengths=(256, 1024, 4096), dtype=torch.float32)


def time_decode_attention(
    block_sizes: Sequence[int] = (8, 16, 32, 64, 128), sizes: KernelSizes | None = None, device=None, repeats: int = 7
) -> list[dict]:
    """Time one decode step of attention, contiguous vs paged, for each length and block size.

    Every sequence of the batch has the same length, so the contiguous baseline is exactly
    what :class:`kvlib.cache.ContiguousKVCache` runs; the paged kernel reads the same K/V
    from shuffled blocks. The two are timed back to back for every block size, and each row
    gives the fastest repeat of both and their ratio: a program that steals the processor
    for a moment can only make a repeat slower. On the CPU the timing uses one thread: on a
    shared two-core machine a second thread is often descheduled, and every parallel
    operation then waits for it.
    """
    device = pick_device() if device is None else torch.device(device)
    sizes = kernel_sizes(device) if sizes is None else sizes
    rows = []
    with torch_threads(1 if device.type == "cpu" else None):
        for length in sizes.lengths:
            for block_size in block_sizes:
                case = random_decode_case(
                    [length] * sizes.batch, block_size, sizes.num_heads, sizes.num_kv_heads, sizes.head_dim,
                    seed=length + block_size, device=device, dtype=sizes.dtype,
                )
                k, v = torch.cat(case.k), torch.cat(case.v)  # (batch, kv_heads, length, head_dim)
                contiguous = lambda: grouped_attention(case.q, k, v, length - 1)  # noqa: E731
                buffers = (GatherBuffer(), GatherBuffer())
                paged = lambda: paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, buffers)  # noqa: E731
                contiguous_s = time_it(contiguous, repeats=repeats, warmup=2, device=device).min_s
                paged_s = time_it(paged, repeats=repeats, warmup=2, device=device).min_s
                rows.append(dict(length=length, block_size=block_size, contiguous_ms=contiguous_s * 1e3,
                                 paged_ms=paged_s * 1e3, ratio=paged_s / contiguous_s))
                del case, k, v, buffers
    return rows


def tokens_identical(block_sizes: Sequence[int] = (1, 16, 64), prompt_lens: Sequence[int] = (3, 17, 40), num_new: int = 12) -> bool:
    """Does the model generate the same tokens on the paged cache (one batch of different-length
    prompts) as on the contiguous cache (each prompt alone), for every block size?"""
    from kvlib.generate import generate

    model = TinyLlama(ModelConfig(vocab_size=128, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=128))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in prompt_lens]
    reference = [generate(model, torch.tensor([p]), num_new, "cache").tokens[0].tolist() for p in prompts]
    return all(generate_paged(model, prompts, num_new, block_size=bs).tokens == reference for bs in block_sizes)


def bench() -> dict:
    """Benchmarks of chapter 3 for ``python -m kvlib bench``."""
    device = pick_device()
    sizes = kernel_sizes(device)
    rows = time_decode_attention(block_sizes=(16,), sizes=KernelSizes(**{**sizes.__dict__, "lengths": sizes.lengths[-1:]}), device=device)
    return {"paged_kernel_overhead": round(rows[0]["ratio"], 3), "paged_tokens_identical": tokens_identical()}


# --------------------------------------------------------------------------- memory waste


@dataclass(frozen=True)
class ReservationWaste:
    """Token slots for a set of requests: reserved contiguously for ``max_len`` each, or in blocks.

    ``used_slots`` hold real tokens. Contiguous reservation wastes ``contiguous_slots -
    used_slots``; paging wastes only the unfilled tails of last blocks
    (``internal_fragmentation``), about half a block per request on average.
    """

    lengths: tuple[int, ...]
    max_len: int
    block_size: int
    paged_slots: int  # blocks taken by the block manager x block_size

    @property
    def num_requests(self) -> int:
        return len(self.lengths)

    @property
    def used_slots(self) -> int:
        return sum(self.lengths)

    @property
    def contiguous_slots(self) -> int:
        return self.num_requests * self.max_len

    @property
    def internal_fragmentation(self) -> int:
        return self.paged_slots - self.used_slots

    @property
    def expected_fragmentation(self) -> float:
        """(block_size - 1) / 2 slots per request: the last block's fill is uniform over 1..block_size."""
        return self.num_requests * (self.block_size - 1) / 2


def reservation_waste(lengths: Sequence[int], max_len: int, block_size: int = 16) -> ReservationWaste:
    """Place every request (its full final length) in a :class:`BlockManager` and count the slots."""
    lengths = tuple(int(n) for n in lengths)
    if not lengths or min(lengths) < 1:
        raise KVLibError(f"request lengths must be positive, not {lengths[:5]}...")
    if max(lengths) > max_len:
        raise KVLibError(f"a request of {max(lengths)} tokens exceeds max_len {max_len}")
    manager = BlockManager(sum(-(-n // block_size) for n in lengths), block_size, enable_prefix_caching=False)
    for seq_id, n in enumerate(lengths):
        manager.allocate(seq_id, [0] * n)
    usage = manager.usage()
    return ReservationWaste(lengths, max_len, block_size, usage.num_used_blocks * block_size)
