"""Chapter 3's measurements of the paged kernel: equality with contiguous attention, and its cost.

- :func:`random_decode_case` and :func:`paged_vs_contiguous_error`: a batch stored both
  contiguously and in shuffled blocks, and the largest difference between the two attentions;
- :func:`kernel_sizes`, :func:`timing_case` and :func:`time_decode_attention`: the decode
  step of attention timed contiguous, gather alone and paged, at sizes whose K/V come from DRAM;
- :func:`time_fused_overhead`: the same comparison on the fused kernel of
  :func:`kvlib.kernels.decode_attention` (numba on a CPU), which reads the blocks in place: the
  contiguous baseline is the very kernel on contiguous memory through an identity block table;
- :func:`tokens_identical`: the model generates the same tokens on the paged cache
  (:func:`kvlib.paged.decode_loop.generate_paged`) as on the contiguous one;
- ``bench()`` for ``python -m kvlib bench``.

:func:`kvlib.plotting.draw_kernel_overhead` draws the timings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from kvlib import KVLibError
from kvlib.kernels.dispatch import as_blocks, contiguous_tables, decode_attention, default_kernel, work_items
from kvlib.kernels.torch_gather import GatherBuffer, attend_gathered, gather_blocks, paged_attention
from kvlib.measure.hardware import dram_bytes
from kvlib.measure.timing import pick_device, round_median, time_interleaved, torch_threads
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import generate_paged
from kvlib.units import ceil_div


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
    seq_lens: Sequence[int],
    block_size: int,
    num_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    num_new: int = 1,
    seed: int = 0,
    device=None,
    dtype=torch.float32,
) -> DecodeCase:
    """Random K/V for sequences of the given lengths, placed in randomly chosen (non-contiguous) blocks."""
    if num_new > min(seq_lens):
        raise KVLibError(f"num_new ({num_new}) exceeds the shortest sequence ({min(seq_lens)} tokens)")
    order_gen = torch.Generator().manual_seed(seed)  # block placement, the same on every device
    data_gen = torch.Generator(device=device).manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=data_gen, device=device, dtype=dtype)  # noqa: E731
    k = [randn(1, num_kv_heads, n, head_dim) for n in seq_lens]
    v = [randn(1, num_kv_heads, n, head_dim) for n in seq_lens]
    num_per_seq = [ceil_div(n, block_size) for n in seq_lens]
    order = torch.randperm(
        sum(num_per_seq), generator=order_gen
    ).tolist()  # physical block of each logical block
    k_cache = torch.zeros(len(order), block_size, num_kv_heads, head_dim, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    tables, first = [], 0
    for seq, count in enumerate(num_per_seq):
        table = order[first : first + count]
        first += count
        positions = torch.arange(seq_lens[seq])
        slots = (torch.tensor(table)[positions // block_size] * block_size + positions % block_size).to(
            device
        )
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
    for seq, (k, v) in enumerate(zip(case.k, case.v, strict=True)):
        reference = grouped_attention(case.q[seq : seq + 1], k, v, q_start=k.shape[2] - num_new)
        worst = max(worst, (paged[seq : seq + 1] - reference).abs().max().item())
    return worst


@dataclass(frozen=True)
class KernelSizes:
    """Decode-attention shapes for the timing of chapter 3, chosen per device.

    ``lengths`` end with the longest, whose K+V (every sequence of the batch) the claims of
    chapter 3 need to come from DRAM; :func:`kernel_sizes` picks it from the hardware.
    """

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    lengths: tuple[int, ...]
    dtype: torch.dtype

    def kv_bytes(self, length: int) -> int:
        """Bytes of K and V that one decode step over ``length`` tokens per sequence reads."""
        return (
            2
            * self.batch
            * self.num_kv_heads
            * length
            * self.head_dim
            * torch.empty((), dtype=self.dtype).element_size()
        )


# Fewest tokens of the longest length: CPU, a step long enough to time; GPU, one that reads
# 2 GiB, far longer than the launches of the step's few dozen kernels.
KERNEL_MIN_LONGEST = {"cpu": 4096, "cuda": 16384}


def kernel_sizes(device=None) -> KernelSizes:
    """Shapes per device: the longest length is the shortest power of two (at least
    ``KERNEL_MIN_LONGEST``) whose K+V reach :func:`kvlib.measure.dram_bytes`, four times the
    last-level cache or more, so that at most a quarter of them can be served from the
    cache; the other lengths are a quarter and a sixteenth of it.

    CPU: float32, 4 sequences, 16 query and 4 KV heads of width 64 (2 KiB of K+V per token
    of a sequence, 8 KiB per position of the batch). GPU: float16, 32 sequences, 32 query and
    8 KV heads of width 128 (4 KiB per token, 128 KiB per position).
    """
    device = pick_device() if device is None else torch.device(device)
    if device.type == "cuda":
        sizes = KernelSizes(
            batch=32, num_heads=32, num_kv_heads=8, head_dim=128, lengths=(1,), dtype=torch.float16
        )
    else:
        sizes = KernelSizes(
            batch=4, num_heads=16, num_kv_heads=4, head_dim=64, lengths=(1,), dtype=torch.float32
        )
    tokens = max(KERNEL_MIN_LONGEST[device.type], ceil_div(dram_bytes(device), sizes.kv_bytes(1)))
    longest = 1 << (tokens - 1).bit_length()
    return replace(sizes, lengths=(longest // 16, longest // 4, longest))


def random_pools(length: int, sizes: KernelSizes, seed: int = 0, device=None):
    """q and the K and V slots of every sequence at ``length``: random values, one pool each,
    ``(batch x length, kv_heads, head_dim)``. :func:`timing_case` lays the same pools out in
    blocks of any size, so a sweep over block sizes draws its gigabytes once per length (the
    sweeps draw before they set one thread: the drawing is not timed)."""
    device = pick_device() if device is None else torch.device(device)
    generator = torch.Generator(device).manual_seed(seed)
    shape = (sizes.batch * length, sizes.num_kv_heads, sizes.head_dim)
    k_pool = torch.empty(shape, device=device, dtype=sizes.dtype).normal_(generator=generator)
    v_pool = torch.empty(shape, device=device, dtype=sizes.dtype).normal_(generator=generator)
    q = torch.empty(sizes.batch, sizes.num_heads, 1, sizes.head_dim, device=device, dtype=sizes.dtype)
    q.normal_(generator=generator)
    return q, k_pool, v_pool


def timing_case(
    length: int,
    block_size: int,
    sizes: KernelSizes,
    seed: int = 0,
    device=None,
    pools=None,
    contiguous: bool = True,
):
    """One decode step's inputs for the timing: q, a pool of shuffled blocks holding every
    sequence's K and V, its block tables and lengths, and (``contiguous``) the same K and V
    stored contiguously.

    The pool is :func:`random_pools` (drawn here unless ``pools`` gives them) viewed in blocks of
    ``block_size``; the blocks' order, drawn from ``seed``, is each sequence's block table. The
    contiguous copy is the pool's gather (token-major, as :func:`paged_attention` sees it after
    its gather), so the contiguous kernel runs the very arithmetic of the paged one on the same
    layout. ``length`` must be a multiple of ``block_size``: every block full.
    """
    if length % block_size:
        raise KVLibError(f"length {length} is not a multiple of block size {block_size}")
    device = pick_device() if device is None else torch.device(device)
    q, k_pool, v_pool = random_pools(length, sizes, seed, device) if pools is None else pools
    per_seq = length // block_size
    num_blocks = sizes.batch * per_seq
    order = torch.randperm(
        num_blocks, generator=torch.Generator().manual_seed(seed)
    )  # physical block of each logical one
    tables = order.view(sizes.batch, per_seq).to(device)
    shape = (num_blocks, block_size, sizes.num_kv_heads, sizes.head_dim)
    k_cache, v_cache = k_pool.view(shape), v_pool.view(shape)  # (num_blocks, block_size, kv_heads, head_dim)
    seq_lens = torch.full((sizes.batch,), length, device=device)
    if not contiguous:
        return q, k_cache, v_cache, tables, seq_lens
    k, v = gather_blocks(k_cache, tables), gather_blocks(v_cache, tables)  # fresh contiguous tensors
    return q, k_cache, v_cache, tables, seq_lens, k, v


def time_decode_attention(
    block_sizes: Sequence[int] = (8, 16, 32, 64, 128),
    sizes: KernelSizes | None = None,
    device=None,
    rounds: int = 7,
) -> list[dict]:
    """Time one decode step of attention three ways, for each length and block size.

    - ``contiguous``: :func:`attend_gathered` on K and V stored contiguously, i.e. the paged
      kernel's arithmetic without its gather (every sequence has the same length, so no mask),
      reading the buffers the paged kernel gathers into, so that both read the same memory
      (the same pages: a copy in other memory may sit on pages of another size);
    - ``gather``: the paged kernel's gather alone, K and V copied out of the shuffled blocks;
    - ``paged``: :func:`paged_attention` itself, gather then arithmetic.

    The three are timed in interleaved rounds (:func:`time_interleaved`). Each row gives
    their fastest samples, the bytes of K+V one step reads, and three ratios, each the
    median over the rounds (:func:`round_median`): ``ratio`` = paged / contiguous,
    ``sum_ratio`` = paged / (gather + contiguous) and ``gather_ratio`` = gather / contiguous.
    On the CPU the timing uses one thread: on a shared two-core machine a second thread is
    often descheduled, and every parallel operation then waits for it.
    """
    device = pick_device() if device is None else torch.device(device)
    sizes = kernel_sizes(device) if sizes is None else sizes
    rows = []
    with torch.inference_mode():
        for length in sizes.lengths:
            pools = random_pools(length, sizes, seed=length, device=device)  # one draw for every block size
            with torch_threads(1 if device.type == "cpu" else None):
                rows += [_time_one_case(length, bs, sizes, device, rounds, pools) for bs in block_sizes]
            del pools
    return rows


def _time_one_case(length: int, block_size: int, sizes: KernelSizes, device, rounds: int, pools=None) -> dict:
    """One row of :func:`time_decode_attention`: the three kernels timed on one case.

    Its gather buffers live only while it runs, so that the next case's fit in memory.
    """
    # no contiguous copy: the contiguous arithmetic reads the paged kernel's own gather buffers
    q, k_cache, v_cache, tables, seq_lens = timing_case(
        length, block_size, sizes, seed=length + block_size, device=device, pools=pools, contiguous=False
    )
    group = sizes.num_heads // sizes.num_kv_heads
    q5 = q.view(sizes.batch, sizes.num_kv_heads, group, 1, sizes.head_dim)  # (batch, kv_heads, group, 1, hd)
    buffers = (GatherBuffer(), GatherBuffer(), GatherBuffer())  # K, V, scores; the gather alone reuses them
    # K and V gathered into the buffers the paged kernel gathers into (every call writes the same
    # values there): the arithmetic timed alone reads the very memory, pages and layout it reads
    k = gather_blocks(k_cache, tables, buffers[0])  # (batch, length, kv_heads, head_dim)
    v = gather_blocks(v_cache, tables, buffers[1])

    def gather():
        return gather_blocks(k_cache, tables, buffers[0]), gather_blocks(v_cache, tables, buffers[1])

    timings = time_interleaved(
        {
            "contiguous": lambda: attend_gathered(q5, k, v, None, buffers[2]),
            "gather": gather,
            "paged": lambda: paged_attention(q, k_cache, v_cache, tables, seq_lens, buffers),
        },
        rounds=rounds,
        number=1,  # one call a sample: each reads megabytes to gigabytes, on one thread's CPU-time clock
        device=device,
    )
    ms = {name: t.min_s * 1e3 for name, t in timings.items()}
    parts = timings["paged"], timings["gather"], timings["contiguous"]
    return dict(
        length=length,
        block_size=block_size,
        kv_bytes=sizes.kv_bytes(length),
        contiguous_ms=ms["contiguous"],
        gather_ms=ms["gather"],
        paged_ms=ms["paged"],
        ratio=round_median(lambda p, g, c: p / c, *parts),
        sum_ratio=round_median(lambda p, g, c: p / (g + c), *parts),
        gather_ratio=round_median(lambda p, g, c: g / c, *parts),
    )


def time_fused_overhead(
    block_sizes: Sequence[int] = (8, 16, 32, 64, 128),
    sizes: KernelSizes | None = None,
    device=None,
    rounds: int = 7,
    kernel: str | None = None,
    lengths: Sequence[int] | None = None,
) -> list[dict]:
    """Paged against contiguous on one kernel (default: the device's), for each length and block size.

    ``paged`` reads the shuffled blocks of :func:`timing_case` through their block tables;
    ``contiguous`` reads the same K and V stored in order, as blocks of the same size behind an
    identity table (sequence b owns blocks b x n to (b + 1) x n - 1), so both do the same
    arithmetic and the same table reads and differ only in where each block lies. Interleaved
    rounds; on the CPU on one thread, timed by its CPU time, as :func:`time_decode_attention`
    (on a shared two-core machine a parallel kernel waits for whichever thread was descheduled,
    and the wall clock counts other programs' time); ``ratio`` = paged / contiguous, the
    median over the rounds of the ratio within a round; ``table_share`` = bytes of block
    table read per byte of K+V (one 8-byte entry per block and work item of
    :func:`kvlib.kernels.work_items`: per block on a CPU, per block and KV head on a GPU).
    """
    device = pick_device() if device is None else torch.device(device)
    sizes = kernel_sizes(device) if sizes is None else sizes
    kernel = default_kernel(device) if kernel is None else kernel
    rows = []
    with torch.inference_mode():
        for length in sizes.lengths if lengths is None else lengths:
            pools = random_pools(length, sizes, seed=length, device=device)  # one draw for every block size
            with torch_threads(1 if device.type == "cpu" else None):
                rows += [
                    _time_fused_case(length, bs, sizes, device, rounds, kernel, pools) for bs in block_sizes
                ]
            del pools
    return rows


def _time_fused_case(
    length: int, block_size: int, sizes: KernelSizes, device, rounds: int, kernel: str, pools=None
):
    """One row of :func:`time_fused_overhead`; its contiguous copies live only while it runs."""
    q, k_cache, v_cache, tables, seq_lens, k, v = timing_case(
        length, block_size, sizes, seed=length + block_size, device=device, pools=pools
    )
    q = q.squeeze(2)  # (batch, num_heads, head_dim): one new token per sequence
    k_in_order, v_in_order = as_blocks(k, block_size), as_blocks(v, block_size)  # views
    identity = contiguous_tables(sizes.batch, length, block_size, device)
    reads_per_entry = work_items(kernel, sizes.batch, sizes.num_kv_heads) // sizes.batch
    timings = time_interleaved(
        {
            "contiguous": lambda: decode_attention(
                q, k_in_order, v_in_order, identity, seq_lens, kernel=kernel
            ),
            "paged": lambda: decode_attention(q, k_cache, v_cache, tables, seq_lens, kernel=kernel),
        },
        rounds=rounds,
        device=device,
    )
    return dict(
        kernel=kernel,
        length=length,
        block_size=block_size,
        kv_bytes=sizes.kv_bytes(length),
        table_share=8 * tables.numel() * reads_per_entry / sizes.kv_bytes(length),
        contiguous_ms=timings["contiguous"].min_s * 1e3,
        paged_ms=timings["paged"].min_s * 1e3,
        ratio=round_median(lambda p, c: p / c, timings["paged"], timings["contiguous"]),
    )


def tokens_identical(
    block_sizes: Sequence[int] = (1, 16, 64), prompt_lens: Sequence[int] = (3, 17, 40), num_new: int = 12
) -> bool:
    """Does the model generate the same tokens on the paged cache (one batch of different-length
    prompts) as on the contiguous cache (each prompt alone), for every block size?"""
    from kvlib.cache.generation import generate

    model = TinyLlama(
        ModelConfig(vocab_size=128, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=128)
    )
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in prompt_lens]
    reference = [generate(model, torch.tensor([p]), num_new, "cache").tokens[0].tolist() for p in prompts]
    return all(
        generate_paged(model, prompts, num_new, block_size=bs).tokens == reference for bs in block_sizes
    )


def bench() -> dict:
    """Benchmarks of chapter 3 for ``python -m kvlib bench``: both kernels at the longest length, block 16."""
    device = pick_device()
    sizes = kernel_sizes(device)
    longest = replace(sizes, lengths=sizes.lengths[-1:])
    gather = time_decode_attention(block_sizes=(16,), sizes=longest, device=device)[0]
    fused = time_fused_overhead(block_sizes=(16,), sizes=longest, device=device)[0]
    return {
        "kernel": fused["kernel"],
        "paged_kernel_overhead": round(fused["ratio"], 3),
        "paged_gather_kernel_overhead": round(gather["ratio"], 3),
        "paged_tokens_identical": tokens_identical(),
    }
