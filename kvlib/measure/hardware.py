"""What the reader's machine has, read rather than assumed (chapter 0; sizes in chapters 1-3 and 6).

:func:`cache_info` reads the cache hierarchy (sysfs on Linux, sysctl on macOS, the L2 of a
GPU), and ``KVBOOK_LLC_BYTES`` overrides the last-level cache so that anyone can check that
the book's claims still hold when every size chosen from it grows. :func:`dram_size` turns
it into the smallest buffer that comes from DRAM (four times the LLC, with a floor, capped
by :func:`available_memory_bytes`), which the probes of :mod:`kvlib.measure.probes` and the
chapters' experiments are sized by. :func:`hardware_report` gathers CPU, cores, RAM,
caches, OS, library versions and GPU into the banner every measuring chapter starts with.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from kvlib import KVLibError
from kvlib.measure.timing import pick_device
from kvlib.units import GiB, KiB, MiB, ceil_div, parse_bytes

# When neither sysfs nor sysctl reports a last-level cache, the book assumes this much: more
# than any laptop's L3 or system cache, so that buffers meant to come from DRAM still do.
FALLBACK_LLC_BYTES = 256 * MiB

# Apple silicon does not report its system-level cache (up to 96 MiB on the Max chips);
# the book adds it to what sysctl says rather than pretend it is absent.
APPLE_SLC_BYTES = 96 * MiB


@dataclass(frozen=True)
class CacheLevel:
    """One level of the CPU's cache hierarchy, summed over its instances."""

    level: int  # 1, 2, 3 (4 where a CPU has an L4 or system cache)
    kind: str  # "Data", "Instruction" or "Unified"
    size_bytes: int  # one instance
    num_instances: int  # e.g. one L2 per core, one L3 per chiplet or socket

    @property
    def total_bytes(self) -> int:
        """Bytes of all instances together."""
        return self.size_bytes * self.num_instances


@dataclass(frozen=True)
class CacheInfo:
    """The cache hierarchy and the last-level cache (LLC) the book sizes its buffers by."""

    levels: tuple[CacheLevel, ...]
    llc_bytes: int  # all instances of the last level together: data must exceed this to come from DRAM
    source: str  # where llc_bytes came from: sysfs, sysctl, the GPU, KVBOOK_LLC_BYTES or the fallback

    @property
    def private_cache_bytes(self) -> int | None:
        """One instance of the largest data cache below the last level: a cache one core (or a
        small cluster of cores) keeps to itself, which chapter 0 reads from to show how much
        faster than DRAM a cache streams (None when nothing was reported; the only level when
        just one is). Not the last level: other cores, and on a cloud machine other tenants,
        share it and can evict what one core keeps there. Unlike ``llc_bytes`` it ignores the
        override: it is the real cache."""
        data = sorted((c for c in self.levels if c.kind != "Instruction"), key=lambda c: c.level)
        if not data:
            return None
        below_last = [c for c in data if c.level < data[-1].level]
        return max(c.size_bytes for c in below_last or data)

    def describe(self) -> str:
        """One line for the banner: the LLC, where it came from, then every level's size and count."""
        levels = ", ".join(
            f"L{c.level}{'d' if c.kind == 'Data' else 'i' if c.kind == 'Instruction' else ''} "
            f"{_fmt_bytes(c.size_bytes)}{f' x{c.num_instances}' if c.num_instances > 1 else ''}"
            for c in self.levels
        )
        return f"LLC {_fmt_bytes(self.llc_bytes)} ({self.source})" + (f"; {levels}" if levels else "")


def _fmt_bytes(num_bytes: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if num_bytes >= size:
            value = num_bytes / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{num_bytes} B"


SYSFS_CPU_ROOT = "/sys/devices/system/cpu"


def _read_text(*parts: str) -> str:
    """The stripped contents of a small sysfs text file."""
    with open(os.path.join(*parts), encoding="ascii") as f:
        return f.read().strip()


def _sysfs_caches(root: str | None = None) -> tuple[CacheLevel, ...]:
    """Linux: every cpu*/cache/index*, instances counted by their distinct shared_cpu_list."""
    root = root or SYSFS_CPU_ROOT
    instances: dict[tuple[int, str], dict[str, int]] = {}
    for cpu in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        base = os.path.join(root, cpu, "cache")
        if not re.fullmatch(r"cpu\d+", cpu) or not os.path.isdir(base):
            continue
        for index in os.listdir(base):
            path = os.path.join(base, index)
            try:
                key = (int(_read_text(path, "level")), _read_text(path, "type"))
                size = parse_bytes(_read_text(path, "size"))
                instances.setdefault(key, {})[_read_text(path, "shared_cpu_list")] = size
            except (OSError, ValueError, KVLibError):
                continue
    return tuple(
        CacheLevel(level, kind, max(sizes.values()), len(sizes))
        for (level, kind), sizes in sorted(instances.items())
    )


def _sysctl_caches() -> tuple[CacheLevel, ...]:
    """macOS: hw.l1dcachesize, hw.l2cachesize, hw.l3cachesize (performance cores' where reported)."""
    import subprocess

    def read(name: str) -> int:
        try:
            out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout
            return int(out.strip() or 0)
        except (OSError, ValueError, subprocess.SubprocessError):
            return 0

    return _levels_from_sysctl(read)


def _levels_from_sysctl(read: Callable[[str], int | None]) -> tuple[CacheLevel, ...]:
    """The cache levels that ``read(sysctl name)`` reports (0 or None where it reports none)."""
    levels = []
    for level, kind, names in (
        (1, "Data", ("hw.perflevel0.l1dcachesize", "hw.l1dcachesize")),
        (2, "Unified", ("hw.perflevel0.l2cachesize", "hw.l2cachesize")),
        (3, "Unified", ("hw.l3cachesize",)),
    ):
        size = next((s for s in map(read, names) if s), 0)
        if size:
            levels.append(CacheLevel(level, kind, size, 1))
    return tuple(levels)


def cache_info(device: torch.device | str | None = None) -> CacheInfo:
    """Read the cache hierarchy: the GPU's L2 on CUDA; on a CPU sysfs (Linux) or sysctl (macOS).

    ``KVBOOK_LLC_BYTES`` (e.g. ``512MiB``) replaces the detected last-level cache, so anyone
    can check that the book's claims still hold when every size chosen from it grows.
    Without a reading the book assumes :data:`FALLBACK_LLC_BYTES` and says so.
    """
    device = pick_device() if device is None else torch.device(device)
    override = os.environ.get("KVBOOK_LLC_BYTES")
    if device.type == "cuda":
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        levels = (CacheLevel(2, "Unified", l2, 1),) if l2 else ()
        llc, source = (l2, "GPU L2") if l2 else (FALLBACK_LLC_BYTES, "not reported: assumed")
    else:
        levels = _sysctl_caches() if platform.system() == "Darwin" else _sysfs_caches()
        data = [c for c in levels if c.kind != "Instruction"]
        llc = max((c for c in data), key=lambda c: c.level).total_bytes if data else 0
        source = "sysctl" if platform.system() == "Darwin" else "sysfs"
        if llc and platform.system() == "Darwin" and platform.machine() == "arm64":
            llc, source = llc + APPLE_SLC_BYTES, "sysctl + 96 MiB system cache assumed"
        if not llc:
            llc, source = FALLBACK_LLC_BYTES, "not reported: assumed"
    if override:
        llc, source = parse_bytes(override, "KVBOOK_LLC_BYTES"), "KVBOOK_LLC_BYTES"
    return CacheInfo(levels, llc, source)


def llc_bytes(device: torch.device | str | None = None) -> int:
    """The last-level cache in bytes (see :func:`cache_info`): what DRAM-sized data must exceed."""
    return cache_info(device).llc_bytes


def all_threads() -> int:
    """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def physical_cores() -> int:
    """Distinct (package, core) pairs in sysfs: cores, not hardware threads; logical CPUs elsewhere."""
    root, seen = SYSFS_CPU_ROOT, set()
    for cpu in os.listdir(root) if os.path.isdir(root) else []:
        try:
            topo = os.path.join(root, cpu, "topology")
            seen.add((_read_text(topo, "physical_package_id"), _read_text(topo, "core_id")))
        except OSError:
            continue
    return len(seen) or os.cpu_count() or 1


def available_memory_bytes(device: torch.device | str | None = None) -> int:
    """Memory free for a new buffer: CUDA's free memory, or MemAvailable (Linux), or the RAM size."""
    device = pick_device() if device is None else torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return _ram_bytes()


@dataclass(frozen=True)
class DramSize:
    """How large a buffer must be to come from DRAM, and whether memory allowed it."""

    num_bytes: int  # the size to use
    wanted_bytes: int  # multiple x LLC (with the floor)
    llc_bytes: int  # the last-level cache it was sized by

    @property
    def bounded(self) -> bool:
        """True when available memory capped the size below what was wanted (stated by callers)."""
        return self.num_bytes < self.wanted_bytes


# Floors: below these a read lasts too little for the clock (CPU) or the launch overhead (GPU).
DRAM_FLOOR_BYTES = {"cpu": 64 * MiB, "cuda": 1 * GiB}


def dram_size(device: torch.device | str | None = None, multiple: int = 4) -> DramSize:
    """The smallest buffer the book treats as read from DRAM: ``multiple`` x LLC, rounded up to MiB.

    Four times the last-level cache leaves at most a quarter of a streamed buffer in cache
    even if the cache kept the most useful part, and a cache with LRU-like replacement
    keeps almost none of a buffer streamed in order. A floor of 64 MiB on a CPU (1 GiB on
    a GPU, whose reads must last far longer than a kernel launch) keeps the read long
    enough to time. The size is capped at a quarter of the available memory.
    """
    device = pick_device() if device is None else torch.device(device)
    if not isinstance(multiple, int) or multiple < 1:
        raise KVLibError(f"multiple must be a positive integer, not {multiple!r}")
    llc = llc_bytes(device)
    wanted = max(ceil_div(multiple * llc, MiB) * MiB, DRAM_FLOOR_BYTES[device.type])
    cap = available_memory_bytes(device) // 4 // MiB * MiB
    return DramSize(min(wanted, max(cap, MiB)), wanted, llc)


def dram_bytes(device: torch.device | str | None = None, multiple: int = 4) -> int:
    """:func:`dram_size`'s byte count: what chapters size DRAM-bound data by."""
    return dram_size(device, multiple).num_bytes


@dataclass(frozen=True)
class HardwareReport:
    """What the numbers in a chapter were measured on."""

    cpu_model: str
    num_cpus: int  # logical CPUs this process may use
    num_cores: int  # physical cores
    ram_bytes: int
    caches: CacheInfo
    os: str
    python: str
    torch: str
    torch_threads: int
    blas: str
    gpu_name: str | None
    gpu_memory_bytes: int | None
    gpu_sm_count: int | None
    gpu_l2_bytes: int | None

    def banner(self) -> str:
        """A short block of text printed at the top of every measuring chapter."""
        gpu = (
            f"{self.gpu_name}, {self.gpu_memory_bytes / GiB:.0f} GiB, {self.gpu_sm_count} SMs, "
            f"L2 {_fmt_bytes(self.gpu_l2_bytes or 0)}"
            if self.gpu_name
            else "none (everything runs on the CPU)"
        )
        threads = f"{self.torch_threads} thread{'s' if self.torch_threads != 1 else ''}"
        cpu = f"{self.cpu_model}, {self.num_cores} cores, {self.num_cpus} threads"
        lines = [
            f"CPU    {cpu}, {self.ram_bytes / GiB:.0f} GiB RAM",
            f"Cache  {self.caches.describe()}",
            f"GPU    {gpu}",
            f"OS     {self.os}",
            f"Python {self.python}, torch {self.torch} ({threads}, BLAS {self.blas})",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Every field as plain data, for ``python -m kvlib env --json``."""
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
    """CPU model, cores and threads, RAM, the CPU's caches, OS, Python, torch and the GPU if any."""
    gpu_name = gpu_bytes = gpu_sms = gpu_l2 = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu_name, gpu_bytes, gpu_sms = props.name, int(props.total_memory), int(props.multi_processor_count)
        gpu_l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return HardwareReport(
        cpu_model=_cpu_model(),
        num_cpus=all_threads(),
        num_cores=physical_cores(),
        ram_bytes=_ram_bytes(),
        caches=cache_info("cpu"),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        blas=_torch_blas(),
        gpu_name=gpu_name,
        gpu_memory_bytes=gpu_bytes,
        gpu_sm_count=gpu_sms,
        gpu_l2_bytes=gpu_l2,
    )
