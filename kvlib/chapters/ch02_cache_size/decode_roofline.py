"""Decode attention's fused kernel on the roofline: achieved GB/s and GFLOP/s against the probes (chapter 2).

:mod:`kvlib.chapters.ch02_cache_size.decode_speed` chooses the shapes
(:func:`~kvlib.chapters.ch02_cache_size.decode_speed.kernel_setup`:
32 query heads of width 128, KV heads 32/8/4/1, contexts whose K and V each exceed four times
the last-level cache); this module times :func:`kvlib.kernels.decode_attention` on them. The
cache is contiguous, read through an identity block table (the kernel's own baseline, chapter 3).

Each kernel call is timed in interleaved rounds (:func:`~kvlib.measure.timing.time_interleaved`)
with the two probes of chapter 0 at the same thread count: the DRAM probe (``tensor.sum()``
over :func:`~kvlib.measure.hardware.dram_bytes`, the operation of
:func:`~kvlib.measure.probes.memory_bandwidth`) and the matmul probe (the square product of
:func:`~kvlib.measure.probes.matmul_gflops`). A ratio of the kernel to a probe is then taken
within each round and the median over the rounds reported (:func:`~kvlib.measure.timing.round_median`):
load that lasts a round slows both alike and cancels. :func:`ridge_point` and
:func:`crossing_group` say at which arithmetic intensity, and so at which group size, decode
attention stops being memory-bound on this device; :func:`split_k_speedup` what Flash-Decoding's
split-K buys MQA at batch 1. :func:`counted_flops` counts a step's FLOPs independently of
:attr:`DecodeMeasurement.flops`, with PyTorch's ``FlopCounterMode`` on chapter 1's grouped attention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kvlib import KVLibError
from kvlib.kernels.dispatch import choose_num_splits, decode_attention, num_workers, work_items
from kvlib.measure.hardware import dram_bytes
from kvlib.measure.timing import Timing, round_median, time_interleaved, torch_threads
from kvlib.sizing.spec import kv_cache_bytes
from kvlib.units import MiB

IDENTITY_BLOCK_SIZE = 16  # tokens per block of the identity block table (vLLM's default block size)


@dataclass(frozen=True)
class RoofProbes:
    """The operands of the two probes, timed beside each kernel call (allocated once per sweep)."""

    buffer: torch.Tensor  # (dram_bytes / 4,) float32 ones: the DRAM probe sums it
    matrix: torch.Tensor  # (size, size) seeded, the setup's dtype: the matmul probe squares it

    @property
    def buffer_bytes(self) -> int:
        """Bytes one DRAM probe call reads."""
        return self.buffer.numel() * self.buffer.element_size()

    @property
    def matmul_flops(self) -> int:
        """FLOPs of one matmul probe call: 2 x size^3."""
        return 2 * self.matrix.shape[0] ** 3


def roof_probes(setup) -> RoofProbes:
    """The probes' operands for ``setup`` (a
    :class:`~kvlib.chapters.ch02_cache_size.decode_speed.DecodeSetup`).

    The operations of :func:`~kvlib.measure.probes.memory_bandwidth` and
    :func:`~kvlib.measure.probes.matmul_gflops` (chapter 0), on operands of their sizes.
    """
    size = 8192 if setup.device.type == "cuda" else 1024
    generator = torch.Generator(setup.device).manual_seed(0)
    matrix = torch.empty(size, size, device=setup.device, dtype=setup.dtype).uniform_(
        -1, 1, generator=generator
    )
    buffer = torch.ones(dram_bytes(setup.device) // 4, dtype=torch.float32, device=setup.device)
    return RoofProbes(buffer, matrix)


@dataclass(frozen=True)
class KernelInputs:
    """One decode step's inputs in the kernel's layout, the cache contiguous behind an identity table."""

    q: torch.Tensor  # (batch, num_heads, head_dim)
    k_cache: torch.Tensor  # (batch x context / block_size, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor
    block_tables: (
        torch.Tensor
    )  # (batch, context / block_size): sequence b owns blocks b x n ... (b + 1) x n - 1
    seq_lens: torch.Tensor  # (batch,) all equal to the context


def kernel_inputs(setup, num_kv_heads: int, context: int, seed: int = 0) -> KernelInputs:
    """Seeded q, K, V (uniform in [-1, 1)) for ``num_kv_heads`` x ``context`` (a multiple of 16)."""
    if num_kv_heads < 1 or setup.num_heads % num_kv_heads:
        raise KVLibError(f"num_kv_heads must divide num_heads ({setup.num_heads}), not {num_kv_heads}")
    if context < 1 or context % IDENTITY_BLOCK_SIZE:
        raise KVLibError(f"context must be a positive multiple of {IDENTITY_BLOCK_SIZE}, not {context}")
    generator = torch.Generator(setup.device).manual_seed(seed)
    per_seq = context // IDENTITY_BLOCK_SIZE

    def uniform(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device=setup.device, dtype=setup.dtype).uniform_(-1, 1, generator=generator)

    shape = (setup.batch * per_seq, IDENTITY_BLOCK_SIZE, num_kv_heads, setup.head_dim)
    k_cache, v_cache = uniform(*shape), uniform(*shape)
    q = uniform(setup.batch, setup.num_heads, setup.head_dim)
    tables = torch.arange(setup.batch * per_seq, device=setup.device).view(setup.batch, per_seq)
    seq_lens = torch.full((setup.batch,), context, device=setup.device)
    return KernelInputs(q, k_cache, v_cache, tables, seq_lens)


@dataclass(frozen=True)
class DecodeMeasurement:
    """One decode step's attention (one layer) timed, and what it implies.

    PyTorch's attention (:mod:`~kvlib.chapters.ch02_cache_size.decode_speed`) is timed alone; the
    kernel (:func:`time_kernel`) with both probes in the same rounds, which gives the fractions of
    the roofline (``probe`` and ``matmul`` are None otherwise).
    """

    impl: str  # what ran: an attention of decode_speed.IMPLEMENTATIONS, or a kvlib.kernels kernel
    num_kv_heads: int
    context: int
    batch: int
    num_heads: int
    head_dim: int
    dtype_bytes: int
    timing: Timing  # the attention, seconds per call
    num_splits: int | None = None  # splits of the context per work item (kvlib.kernels.work_items)
    probe: Timing | None = None  # the DRAM probe in the same rounds
    probe_bytes: int = 0
    matmul: Timing | None = None  # the matmul probe in the same rounds
    matmul_flops: int = 0

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V one step reads: one layer's cache (:func:`~kvlib.sizing.spec.kv_cache_bytes`)."""
        return kv_cache_bytes(1, self.num_kv_heads, self.head_dim, self.context, self.batch, self.dtype_bytes)

    @property
    def flops(self) -> int:
        """q.K^T and weights.V: 4 x batch x heads x context x head_dim (a multiply-add counts 2)."""
        return 4 * self.batch * self.num_heads * self.context * self.head_dim

    @property
    def intensity(self) -> float:
        """FLOPs per byte of K/V: 2 x group / dtype bytes (the group is num_heads / num_kv_heads)."""
        return self.flops / self.kv_bytes

    @property
    def gbps(self) -> float:
        """Achieved bandwidth over the median time (GB/s = 1e9 B/s)."""
        return self.kv_bytes / self.timing.median_s / 1e9

    @property
    def best_gbps(self) -> float:
        """Bandwidth of the fastest sample: what the step achieved when least disturbed."""
        return self.kv_bytes / self.timing.min_s / 1e9

    @property
    def gflops(self) -> float:
        """Achieved arithmetic rate over the median time."""
        return self.flops / self.timing.median_s / 1e9

    @property
    def probe_gbps(self) -> float:
        """The DRAM probe's median rate in these rounds: the memory roof."""
        return self.probe_bytes / self._probed(self.probe).median_s / 1e9

    @property
    def peak_gflops(self) -> float:
        """The matmul probe's median rate in these rounds: the compute roof."""
        return self.matmul_flops / self._probed(self.matmul).median_s / 1e9

    @property
    def bw_fraction(self) -> float:
        """Achieved GB/s over the probe's, the median over the rounds of the ratio within a round."""
        return round_median(
            lambda t, p: (self.kv_bytes / t) / (self.probe_bytes / p), self.timing, self._probed(self.probe)
        )

    @property
    def roofline_fraction(self) -> float:
        """The roofline bound max(bytes / bandwidth, FLOPs / peak) over the measured time, round by round."""

        def fraction(t: float, p: float, m: float) -> float:
            bound = max(self.kv_bytes * p / self.probe_bytes, self.flops * m / self.matmul_flops)
            return bound / t

        return round_median(fraction, self.timing, self._probed(self.probe), self._probed(self.matmul))

    def _probed(self, timing: Timing | None) -> Timing:
        if timing is None:
            raise KVLibError(f"{self.impl} was timed without the probes: no roofline fraction to give")
        return timing

    def row(self) -> dict:
        """This measurement as a table row (a DataFrame's); the roofline columns where probes were timed."""
        row = {
            "impl": self.impl,
            "kv heads": self.num_kv_heads,
            "context": self.context,
            "K+V MiB": self.kv_bytes / MiB,
        }
        if self.num_splits is not None:
            row["splits"] = self.num_splits
        row |= {
            "time ms": self.timing.median_s * 1e3,
            "GB/s": self.gbps,
            "GFLOP/s": self.gflops,
            "FLOP/byte": self.intensity,
        }
        if self.probe is not None and self.matmul is not None:
            row |= {"of DRAM probe": self.bw_fraction, "of roofline": self.roofline_fraction}
        return row


def time_kernel(
    setup, inputs: KernelInputs, probes: RoofProbes, num_splits: int | None = None, rounds: int = 5
) -> DecodeMeasurement:
    """Time ``setup.kernel`` on ``inputs`` in ``rounds`` interleaved rounds with both probes (wall clock,
    the setup's threads for the probes; the kernel's own threads are all of them)."""
    batch, num_kv_heads = inputs.seq_lens.shape[0], inputs.k_cache.shape[2]
    context = int(inputs.seq_lens.max())
    if num_splits is None:  # what decode_attention would choose, fixed here so that the row can say it
        items = work_items(setup.kernel, batch, num_kv_heads)
        num_splits = choose_num_splits(items, context, num_workers(setup.device))

    def step():
        return decode_attention(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            inputs.block_tables,
            inputs.seq_lens,
            kernel=setup.kernel,
            num_splits=num_splits,
        )

    fns = {"kernel": step, "probe": probes.buffer.sum, "matmul": lambda: probes.matrix @ probes.matrix}
    with torch.inference_mode(), torch_threads(setup.threads):
        timings = time_interleaved(fns, rounds=rounds, device=setup.device, clock="wall")
    return DecodeMeasurement(
        setup.kernel,
        num_kv_heads,
        context,
        batch,
        setup.num_heads,
        setup.head_dim,
        inputs.k_cache.element_size(),
        timings["kernel"],
        num_splits,
        timings["probe"],
        probes.buffer_bytes,
        timings["matmul"],
        probes.matmul_flops,
    )


def kernel_sweep(setup, probes: RoofProbes | None = None, rounds: int = 5) -> list[DecodeMeasurement]:
    """Every (context, KV heads) pair of the setup, one cache allocated at a time."""
    probes = roof_probes(setup) if probes is None else probes
    return [
        time_kernel(setup, kernel_inputs(setup, kv, context), probes, rounds=rounds)
        for context in setup.contexts
        for kv in setup.kv_heads
    ]


def counted_flops(setup, num_kv_heads: int, context: int) -> int:
    """FLOPs of one decode step's attention as PyTorch's ``FlopCounterMode`` counts them in
    :func:`~kvlib.model.attention.grouped_attention` (the same products, q.K^T and weights.V) at the
    setup's shapes, on the meta device (no memory, no arithmetic): a count independent of
    :attr:`DecodeMeasurement.flops`' formula."""
    from torch.utils.flop_counter import FlopCounterMode

    from kvlib.model.attention import grouped_attention

    if num_kv_heads < 1 or setup.num_heads % num_kv_heads:
        raise KVLibError(f"num_kv_heads must divide num_heads ({setup.num_heads}), not {num_kv_heads}")
    if context < 1:
        raise KVLibError(f"context must be a positive number of tokens, not {context}")
    meta = {"device": "meta", "dtype": setup.dtype}
    q = torch.empty(setup.batch, setup.num_heads, 1, setup.head_dim, **meta)
    k = torch.empty(setup.batch, num_kv_heads, context, setup.head_dim, **meta)
    with FlopCounterMode(display=False) as counter:
        grouped_attention(q, k, torch.empty_like(k), q_start=context - 1)
    return counter.get_total_flops()


def ridge_point(peak_gflops: float, gbps: float) -> float:
    """FLOPs per byte at which the two roofs meet: below it memory bounds a kernel, above it arithmetic."""
    if peak_gflops <= 0 or gbps <= 0:
        raise KVLibError(f"peak and bandwidth must be positive, not {peak_gflops} and {gbps}")
    return peak_gflops / gbps


def crossing_group(ridge: float, dtype_bytes: int) -> float:
    """The group size (query heads per KV head) whose intensity 2 x group / dtype bytes is ``ridge``."""
    if ridge <= 0 or dtype_bytes < 1:
        raise KVLibError(f"ridge and dtype_bytes must be positive, not {ridge} and {dtype_bytes}")
    return ridge * dtype_bytes / 2


@dataclass(frozen=True)
class SplitK:
    """MQA at batch 1 without and with split-K, timed in interleaved rounds."""

    num_splits: int  # what choose_num_splits picked
    one: Timing  # num_splits=1
    split: Timing  # num_splits chosen

    @property
    def speedup(self) -> float:
        """Time without splits over time with them, the median over the rounds of the ratio within a round."""
        return round_median(lambda one, split: one / split, self.one, self.split)


def split_k_speedup(setup, context: int | None = None, rounds: int = 7) -> SplitK:
    """Split-K for MQA (one KV head) at batch 1 and ``context`` (default: the setup's longest)."""
    context = setup.longest if context is None else context
    inputs = kernel_inputs(replace(setup, batch=1), 1, context)
    chosen = choose_num_splits(work_items(setup.kernel, 1, 1), context, num_workers(setup.device))

    def run(num_splits: int):
        args = inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_tables, inputs.seq_lens
        return lambda: decode_attention(*args, kernel=setup.kernel, num_splits=num_splits)

    with torch.inference_mode(), torch_threads(setup.threads):
        timings = time_interleaved(
            {"one": run(1), "split": run(chosen)}, rounds=rounds, device=setup.device, clock="wall"
        )
    return SplitK(chosen, timings["one"], timings["split"])


def split_k_error(setup, context: int | None = None) -> float:
    """Largest difference between MQA's attention at batch 1 with one split and with the chosen number
    (the same inputs as :func:`split_k_speedup`), over the largest magnitude of the one-split output: the
    log-sum-exp merge is exact up to rounding, and a merge that mis-weighted a split would be off by
    about the output's own size."""
    context = setup.longest if context is None else context
    inputs = kernel_inputs(replace(setup, batch=1), 1, context)
    args = inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_tables, inputs.seq_lens
    chosen = choose_num_splits(work_items(setup.kernel, 1, 1), context, num_workers(setup.device))
    with torch.inference_mode():
        one = decode_attention(*args, kernel=setup.kernel, num_splits=1)
        split = decode_attention(*args, kernel=setup.kernel, num_splits=chosen)
    return ((one.float() - split.float()).abs().max() / one.float().abs().max()).item()
