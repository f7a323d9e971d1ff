"""How kvbook measures: one timer, one hardware banner, one bandwidth probe.

Every measuring chapter starts with ``print(hardware_report().banner())`` and times
through :func:`time_it`, so all numbers in the book are taken the same way:
warm-up calls first, CUDA synchronised around every sample, several repeats, and
the median reported with the min and max beside it. The chapter
"How to read the measurements" (``book/00_measurements.ipynb``) introduces them.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from kvlib import KVLibError


def pick_device(prefer: str | None = None) -> torch.device:
    """CUDA when a GPU is present, else the CPU (every chapter runs on both).

    ``prefer`` ("cpu" or "cuda") overrides the choice; asking for CUDA on a machine
    without it is an error rather than a silent fall-back to the CPU.
    """
    if prefer is None:
        prefer = os.environ.get("KVBOOK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if prefer not in ("cpu", "cuda"):
        raise KVLibError(f"device must be 'cpu' or 'cuda', not {prefer!r}")
    if prefer == "cuda" and not torch.cuda.is_available():
        raise KVLibError("device 'cuda' was asked for, but torch sees no CUDA GPU")
    return torch.device(prefer)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work (a no-op on the CPU): kernels launch asynchronously."""
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    elif torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one timed function: median, min and max over the repeats."""

    median_s: float
    min_s: float
    max_s: float
    samples: tuple[float, ...]

    @property
    def spread(self) -> float:
        """max / min: how noisy the repeats were (1.0 means identical)."""
        return self.max_s / self.min_s if self.min_s > 0 else float("inf")

    def __str__(self) -> str:
        return f"{_fmt_s(self.median_s)} (min {_fmt_s(self.min_s)}, max {_fmt_s(self.max_s)}, n={len(self.samples)})"


def _fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


@contextmanager
def torch_threads(threads: int | None):
    """Run the block with ``threads`` torch threads (no change for None), then restore the setting.

    Tiny models on a CPU run faster and steadier on one thread (chapters 1–4 measure so);
    on a GPU callers pass None.
    """
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_it(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    number: int = 1,
    device: torch.device | str | None = None,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` samples of ``number`` calls each.

    Each sample is the wall-clock time of ``number`` back-to-back calls divided by
    ``number`` (use ``number > 1`` for calls too short for the clock). CUDA is
    synchronised before and after each sample so that asynchronous kernels are
    counted. Reports the median (robust to a stray slow sample) with min and max.
    """
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0), ("number", number, 1)):
        if not isinstance(value, int) or value < low:
            raise KVLibError(f"{name} must be an integer >= {low}, not {value!r}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize(device)
        samples.append((time.perf_counter() - start) / number)
    return Timing(statistics.median(samples), min(samples), max(samples), tuple(samples))


# --------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class HardwareReport:
    """What the numbers in a chapter were measured on."""

    cpu_model: str
    num_cpus: int
    ram_bytes: int
    os: str
    python: str
    torch: str
    torch_threads: int
    blas: str
    gpu_name: str | None
    gpu_memory_bytes: int | None

    def banner(self) -> str:
        """A short block of text printed at the top of every measuring chapter."""
        gpu = (
            f"{self.gpu_name}, {self.gpu_memory_bytes / 2**30:.0f} GiB"
            if self.gpu_name
            else "none (everything runs on the CPU)"
        )
        lines = [
            f"CPU    {self.cpu_model}, {self.num_cpus} cores, {self.ram_bytes / 2**30:.0f} GiB RAM",
            f"GPU    {gpu}",
            f"OS     {self.os}",
            f"Python {self.python}, torch {self.torch} ({self.torch_threads} thread{'s' if self.torch_threads != 1 else ''}, BLAS {self.blas})",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _torch_blas() -> str:
    match = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return match.group(1) if match else "unknown"


def hardware_report() -> HardwareReport:
    """Collect CPU model, cores, RAM, OS, Python, torch (threads, BLAS) and the GPU if any."""
    gpu_name = gpu_bytes = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu_name, gpu_bytes = props.name, int(props.total_memory)
    return HardwareReport(
        cpu_model=_cpu_model(),
        num_cpus=os.cpu_count() or 1,
        ram_bytes=_ram_bytes(),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        blas=_torch_blas(),
        gpu_name=gpu_name,
        gpu_memory_bytes=gpu_bytes,
    )


# --------------------------------------------------------------------------- bandwidth


@dataclass(frozen=True)
class Bandwidth:
    """Result of :func:`memory_bandwidth`: bytes streamed and the rates achieved (GB/s = 1e9 B/s)."""

    device: str
    num_bytes: int
    timing: Timing

    @property
    def gbps(self) -> float:
        """Median rate: the figure the book compares decode attention against."""
        return self.num_bytes / self.timing.median_s / 1e9

    @property
    def best_gbps(self) -> float:
        """Fastest sample: closest to what the memory can do at all."""
        return self.num_bytes / self.timing.min_s / 1e9


def memory_bandwidth(
    num_bytes: int | None = None, device: torch.device | str | None = None, repeats: int = 7
) -> Bandwidth:
    """Measure streaming-read bandwidth: how fast this device can read a large buffer once.

    Method: fill a float32 tensor of ``num_bytes`` (default 256 MiB on the CPU, 2 GiB
    on a GPU: far larger than any cache, so every byte comes from DRAM/HBM) and time
    ``tensor.sum()``. A sum reads every element exactly once, writes one number and
    does one add per 4 bytes read, so it is limited by memory reads, not arithmetic,
    and torch runs it on all threads (CPU) or all SMs (GPU). Bytes read divided by
    the median time is the rate. Decode attention also streams K and V once per
    step, so this is the ceiling chapter 2 compares it with.
    """
    device = pick_device() if device is None else torch.device(device)
    if num_bytes is None:
        num_bytes = (2 << 30) if device.type == "cuda" else (256 << 20)
    if not isinstance(num_bytes, int) or num_bytes < 4096:
        raise KVLibError(f"num_bytes must be an integer of at least 4096, not {num_bytes!r}")
    buffer = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    timing = time_it(buffer.sum, repeats=repeats, warmup=2, device=device)
    return Bandwidth(device=str(device), num_bytes=buffer.numel() * 4, timing=timing)


def bench() -> dict:
    """Benchmarks of this module for ``python -m kvlib bench``."""
    probe = memory_bandwidth()
    return {"mem_bandwidth_gbps": round(probe.gbps, 2), "mem_bandwidth_best_gbps": round(probe.best_gbps, 2)}
