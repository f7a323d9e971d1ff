"""What the reader's machine can do: DRAM bandwidth, matmul rate and kernel-launch overhead.

Chapter 0 introduces the probes; the others compare their measurements with them: decode
attention against :func:`memory_bandwidth` on chapter 2's roofline (whose flat roof is
:func:`matmul_gflops`), chapter 1's GPU batch from :func:`launch_overhead_s` and
:func:`matmul_gflops`, chapter 4's step-time regimes against :func:`memory_bandwidth`. Each
probe is timed by :func:`~kvlib.measure.timing.time_it` on a buffer sized by
:func:`~kvlib.measure.hardware.dram_bytes`, at one thread or at all threads, and
:func:`bench` reports them for ``python -m kvlib bench``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.measure.hardware import all_threads, dram_bytes, dram_size
from kvlib.measure.timing import Timing, pick_device, time_it, torch_threads


def _threads_for(device: torch.device, threads: int | None) -> int | None:
    """Torch threads for a CPU probe (None = all threads); None on a GPU, where threads do not apply."""
    if device.type != "cpu":
        return None
    if threads is None:
        return all_threads()
    if not isinstance(threads, int) or threads < 1:
        raise KVLibError(f"threads must be a positive integer or None (all threads), not {threads!r}")
    return threads


@dataclass(frozen=True)
class Bandwidth:
    """Result of :func:`memory_bandwidth`: bytes streamed and the rates achieved (GB/s = 1e9 B/s)."""

    device: str
    num_bytes: int
    timing: Timing
    threads: int | None = None  # torch threads on a CPU; None on a GPU

    @property
    def gbps(self) -> float:
        """Median rate: the figure the book compares decode attention against."""
        return self.num_bytes / self.timing.median_s / 1e9

    @property
    def best_gbps(self) -> float:
        """Fastest sample: closest to what the memory can do at all."""
        return self.num_bytes / self.timing.min_s / 1e9


def memory_bandwidth(
    num_bytes: int | None = None,
    device: torch.device | str | None = None,
    repeats: int = 7,
    threads: int | None = None,
    clock: str = "wall",
) -> Bandwidth:
    """Measure streaming-read bandwidth: how fast this device reads a buffer from DRAM once.

    Method: fill a float32 tensor of ``num_bytes`` (default :func:`dram_bytes`: four times
    the last-level cache or more, so nearly every byte comes from DRAM/HBM) and time
    ``tensor.sum()`` on ``threads`` torch threads (None: all the CPUs this process may
    use; ignored on a GPU). A sum reads every element once, writes one number and does one
    add per 4 bytes read, so memory reads limit it, not arithmetic. Any measurement the
    book compares with this probe is taken at the same thread count (and ``clock``, see
    :func:`time_it`).
    """
    device = pick_device() if device is None else torch.device(device)
    threads = _threads_for(device, threads)
    if num_bytes is None:
        num_bytes = dram_bytes(device)
    if not isinstance(num_bytes, int) or num_bytes < 4096:
        raise KVLibError(f"num_bytes must be an integer of at least 4096, not {num_bytes!r}")
    buffer = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    with torch_threads(threads):
        timing = time_it(buffer.sum, repeats=repeats, warmup=2, device=device, clock=clock)
    return Bandwidth(device=str(device), num_bytes=buffer.numel() * 4, timing=timing, threads=threads)


@dataclass(frozen=True)
class Compute:
    """Result of :func:`matmul_gflops`: a square matmul's rate, the roofline's flat roof."""

    device: str
    size: int  # rows = columns of the square matrix
    dtype: str
    timing: Timing
    threads: int | None = None  # torch threads on a CPU; None on a GPU

    @property
    def flops(self) -> int:
        """FLOPs of one product: one multiply and one add per (row, column, inner) triple."""
        return 2 * self.size**3

    @property
    def gflops(self) -> float:
        """Median rate in GFLOP/s: the roof the book draws."""
        return self.flops / self.timing.median_s / 1e9

    @property
    def best_gflops(self) -> float:
        """Rate of the fastest sample: closest to what the machine can do at all."""
        return self.flops / self.timing.min_s / 1e9


def matmul_gflops(
    device: torch.device | str | None = None,
    threads: int | None = None,
    dtype: torch.dtype = torch.float32,
    size: int | None = None,
    repeats: int = 5,
) -> Compute:
    """Measure the compute roof: GFLOP/s of a seeded square ``size`` x ``size`` matmul.

    The default size (1024 on a CPU, 8192 on a GPU) does 2 GFLOP (1.1 TFLOP) per call,
    enough to run at the BLAS's full rate and long enough to time; ``threads`` as in
    :func:`memory_bandwidth`.
    """
    device = pick_device() if device is None else torch.device(device)
    threads = _threads_for(device, threads)
    size = size or (8192 if device.type == "cuda" else 1024)
    if not isinstance(size, int) or size < 16:
        raise KVLibError(f"size must be an integer of at least 16, not {size!r}")
    generator = torch.Generator(device).manual_seed(0)
    a = torch.empty(size, size, device=device, dtype=dtype).uniform_(-1, 1, generator=generator)
    with torch_threads(threads):
        timing = time_it(lambda: a @ a, repeats=repeats, warmup=2, device=device)
    return Compute(str(device), size, str(dtype).removeprefix("torch."), timing, threads)


def launch_overhead_s(device: torch.device | str | None = None, number: int = 200) -> float:
    """Seconds per call of a one-element torch op: the fixed cost of every kernel a step launches.

    On a GPU this is the launch rate of back-to-back kernels (a few microseconds); on a CPU
    the dispatch cost of one torch operator. Fastest of five samples of ``number`` calls.
    """
    device = pick_device() if device is None else torch.device(device)
    x = torch.zeros(1, device=device)
    return time_it(lambda: x.add_(1.0), repeats=5, warmup=1, number=number, device=device).min_s


def bench() -> dict:
    """Benchmarks of this module for ``python -m kvlib bench``: the hardware probes, both thread counts."""
    size = dram_size()
    probe_all, probe_one = memory_bandwidth(size.num_bytes), memory_bandwidth(size.num_bytes, threads=1)
    return {
        "llc_bytes": size.llc_bytes,
        "mem_probe_bytes": size.num_bytes,
        "mem_probe_bounded": size.bounded,
        "mem_bandwidth_gbps": round(probe_all.gbps, 2),
        "mem_bandwidth_best_gbps": round(probe_all.best_gbps, 2),
        "mem_bandwidth_1thread_gbps": round(probe_one.gbps, 2),
        "matmul_gflops": round(matmul_gflops().gflops, 1),
        "matmul_1thread_gflops": round(matmul_gflops(threads=1).gflops, 1),
    }
