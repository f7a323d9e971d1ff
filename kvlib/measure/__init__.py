"""Measuring on the reader's hardware (chapter 0, and every chapter that times something).

- ``timing``: the one timer (:func:`time_it`: warm-up, repeats, median and fastest; CUDA
  synchronised), interleaved rounds for fair comparisons, the wall and thread clocks, and
  thread control.
- ``hardware``: what the machine has, read rather than assumed: cache sizes (and the
  ``KVBOOK_LLC_BYTES`` override), cores, memory, the DRAM-sized buffer of a probe, and the
  hardware banner every measuring chapter starts with.
- ``probes``: what the machine can do: DRAM bandwidth, matmul FLOP/s and kernel-launch
  overhead, at one thread and at all threads.
"""

from kvlib.measure.hardware import (
    APPLE_SLC_BYTES,
    DRAM_FLOOR_BYTES,
    FALLBACK_LLC_BYTES,
    SYSFS_CPU_ROOT,
    CacheInfo,
    CacheLevel,
    DramSize,
    HardwareReport,
    all_threads,
    available_memory_bytes,
    cache_info,
    dram_bytes,
    dram_size,
    hardware_report,
    llc_bytes,
    physical_cores,
)
from kvlib.measure.probes import Bandwidth, Compute, launch_overhead_s, matmul_gflops, memory_bandwidth
from kvlib.measure.timing import (
    CLOCKS,
    Timing,
    clock_for,
    one_cpu_thread,
    pick_device,
    read_clock,
    round_median,
    synchronize,
    time_interleaved,
    time_it,
    torch_threads,
)

__all__ = [
    "APPLE_SLC_BYTES",
    "Bandwidth",
    "CLOCKS",
    "CacheInfo",
    "CacheLevel",
    "Compute",
    "DRAM_FLOOR_BYTES",
    "DramSize",
    "FALLBACK_LLC_BYTES",
    "HardwareReport",
    "SYSFS_CPU_ROOT",
    "Timing",
    "all_threads",
    "available_memory_bytes",
    "cache_info",
    "clock_for",
    "dram_bytes",
    "dram_size",
    "hardware_report",
    "launch_overhead_s",
    "llc_bytes",
    "matmul_gflops",
    "memory_bandwidth",
    "one_cpu_thread",
    "physical_cores",
    "pick_device",
    "read_clock",
    "round_median",
    "synchronize",
    "time_interleaved",
    "time_it",
    "torch_threads",
]
