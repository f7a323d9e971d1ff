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
from typing import Callable, Mapping

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


CLOCKS = ("wall", "thread")  # time.perf_counter, time.thread_time


def read_clock(clock: str = "wall") -> float:
    """Seconds on ``clock``: the wall clock, or the CPU time of the calling thread (see :func:`time_it`)."""
    return time.thread_time() if clock == "thread" else time.perf_counter()


def clock_for(device: torch.device | str, threads: int | None) -> str:
    """The clock that times work on ``device`` with ``threads`` torch threads fairly on a busy machine:
    the thread's CPU time for one CPU thread (it runs on the caller), else the wall clock."""
    return "thread" if torch.device(device).type == "cpu" and threads == 1 else "wall"


def time_it(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    number: int = 1,
    device: torch.device | str | None = None,
    clock: str = "wall",
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` samples of ``number`` calls each.

    Each sample is the time of ``number`` back-to-back calls divided by ``number`` (use
    ``number > 1`` for calls too short for the clock). CUDA is synchronised before and
    after each sample so that asynchronous kernels are counted. Reports the median (robust
    to a stray slow sample) with min and max.

    ``clock="wall"`` (the default) reads wall-clock time. ``clock="thread"`` reads the CPU
    time of the calling thread, for work that runs on that thread alone (torch on one
    thread): time the thread waits for memory counts, time another program holds the core
    does not, so a busy machine cannot stretch a sample. It cannot time a GPU.
    """
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0), ("number", number, 1)):
        if not isinstance(value, int) or value < low:
            raise KVLibError(f"{name} must be an integer >= {low}, not {value!r}")
    if clock not in CLOCKS:
        raise KVLibError(f"clock must be one of {', '.join(CLOCKS)}, not {clock!r}")
    if clock == "thread" and device is not None and torch.device(device).type != "cpu":
        raise KVLibError("clock='thread' measures the calling thread's CPU time and cannot time a GPU")
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = read_clock(clock)
        for _ in range(number):
            fn()
        synchronize(device)
        samples.append((read_clock(clock) - start) / number)
    return Timing(statistics.median(samples), min(samples), max(samples), tuple(samples))


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    rounds: int = 7,
    *,
    number: int | None = None,
    target_s: float | None = None,
    warmup: int = 1,
    device: torch.device | str | None = None,
    clock: str | None = None,
) -> dict[str, Timing]:
    """Time several functions to compare them: ``rounds`` rounds, each taking one sample of every function.

    The order rotates from round to round, so that no function always goes first. A program
    that slows the machine for a while then slows whichever samples run meanwhile: across
    the rounds it lands on all the functions instead of on the whole run of one. Each
    function is called ``warmup`` times first (0 for functions with state, whose every call
    counts). A sample is ``number`` back-to-back calls; with ``number=None`` each function
    gets as many as make a sample last about ``target_s`` (None: as long as the slowest
    function's call, and at least 10 ms), so that samples of equal length see the same share
    of a steady load. The clock defaults to :func:`clock_for` the device and torch's threads
    (on one CPU thread the thread's CPU time). Chapters 1, 3 and 6 compare timings this way,
    by their fastest samples or by :func:`round_median`.
    """
    if not fns:
        raise KVLibError("time_interleaved needs at least one function to time")
    for name, value, low in (("rounds", rounds, 1), ("warmup", warmup, 0), ("number", number or 1, 1)):
        if not isinstance(value, int) or value < low:
            raise KVLibError(f"{name} must be an integer >= {low}, not {value!r}")
    device = pick_device() if device is None else torch.device(device)
    clock = clock or clock_for(device, torch.get_num_threads())

    def sample(fn, calls: int) -> float:
        return time_it(fn, repeats=1, warmup=0, number=calls, device=device, clock=clock).min_s

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if number is None:
        once = {name: sample(fn, 1) for name, fn in fns.items()}
        target = max(0.01, *once.values()) if target_s is None else target_s
        numbers = {name: max(1, round(target / max(t, 1e-7))) for name, t in once.items()}
    else:
        numbers = dict.fromkeys(fns, number)
    names, samples = list(fns), {name: [] for name in fns}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(sample(fns[name], numbers[name]))
    return {name: Timing(statistics.median(s), min(s), max(s), tuple(s)) for name, s in samples.items()}


def round_median(expression: Callable[..., float], *timings: Timing) -> float:
    """Median over the rounds of :func:`time_interleaved` of ``expression`` applied to the
    timings' samples of one round (e.g. ``lambda p, c: p / c`` for a ratio of two kernels).

    The samples of one round run back to back, so load that lasts a round scales them
    alike and cancels in a ratio; the median then sets aside the rounds that a burst of load
    hit unevenly (chapters 3 and 6).
    """
    if not timings or len({len(t.samples) for t in timings}) != 1:
        raise KVLibError("round_median needs timings with the same number of rounds")
    return statistics.median(expression(*values) for values in zip(*(t.samples for t in timings)))


# --------------------------------------------------------------------------- hardware facts

MiB = 1 << 20
GiB = 1 << 30
# When neither sysfs nor sysctl reports a last-level cache, the book assumes this much: more
# than any laptop's L3 or system cache, so that buffers meant to come from DRAM still do.
FALLBACK_LLC_BYTES = 256 * MiB
# Apple silicon does not report its system-level cache (up to 96 MiB on the Max chips);
# the book adds it to what sysctl says rather than pretend it is absent.
APPLE_SLC_BYTES = 96 * MiB
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?|[KMG])?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": MiB, "G": GiB}


def parse_bytes(text: str, what: str = "size") -> int:
    """``"536870912"``, ``"512MiB"``, ``"512M"`` or ``"32K"`` in bytes (binary units); else a KVLibError."""
    match = _SIZE.match(str(text))
    if not match or int(match.group(1)) <= 0:
        raise KVLibError(f"{what} must be a positive size in bytes such as 536870912 or 512MiB, not {text!r}")
    return int(match.group(1)) * _UNITS[(match.group(2) or "")[:1].upper()]


@dataclass(frozen=True)
class CacheLevel:
    """One level of the CPU's cache hierarchy, summed over its instances."""

    level: int  # 1, 2, 3 (4 where a CPU has an L4 or system cache)
    kind: str  # "Data", "Instruction" or "Unified"
    size_bytes: int  # one instance
    num_instances: int  # e.g. one L2 per core, one L3 per chiplet or socket

    @property
    def total_bytes(self) -> int:
        return self.size_bytes * self.num_instances


@dataclass(frozen=True)
class CacheInfo:
    """The cache hierarchy and the last-level cache (LLC) the book sizes its buffers by."""

    levels: tuple[CacheLevel, ...]
    llc_bytes: int  # all instances of the last level together: data must exceed this to come from DRAM
    source: str  # where llc_bytes came from: sysfs, sysctl, the GPU, KVBOOK_LLC_BYTES or the fallback

    @property
    def largest_instance_bytes(self) -> int | None:
        """One instance of the largest reported data cache: what a single core's reads can fill
        (None when nothing was reported). Unlike ``llc_bytes`` it ignores the override: it is
        the real cache, which chapter 0 reads from to show the difference."""
        data = [c for c in self.levels if c.kind != "Instruction"]
        return max(c.size_bytes for c in data) if data else None

    def describe(self) -> str:
        levels = ", ".join(
            f"L{c.level}{'d' if c.kind == 'Data' else 'i' if c.kind == 'Instruction' else ''} "
            f"{_fmt_bytes(c.size_bytes)}{f' x{c.num_instances}' if c.num_instances > 1 else ''}"
            for c in self.levels
        )
        return f"LLC {_fmt_bytes(self.llc_bytes)} ({self.source})" + (f"; {levels}" if levels else "")


def _fmt_bytes(num_bytes: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if num_bytes >= size:
            value = num_bytes / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{num_bytes} B"


SYSFS_CPU_ROOT = "/sys/devices/system/cpu"


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
                read = lambda name: open(os.path.join(path, name), encoding="ascii").read().strip()  # noqa: E731
                key = (int(read("level")), read("type"))
                instances.setdefault(key, {})[read("shared_cpu_list")] = parse_bytes(read("size"))
            except (OSError, ValueError, KVLibError):
                continue
    return tuple(
        CacheLevel(level, kind, max(sizes.values()), len(sizes)) for (level, kind), sizes in sorted(instances.items())
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
    for level, kind, names in ((1, "Data", ("hw.perflevel0.l1dcachesize", "hw.l1dcachesize")),
                               (2, "Unified", ("hw.perflevel0.l2cachesize", "hw.l2cachesize")),
                               (3, "Unified", ("hw.l3cachesize",))):
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
    root, seen = "/sys/devices/system/cpu", set()
    for cpu in os.listdir(root) if os.path.isdir(root) else []:
        try:
            topo = os.path.join(root, cpu, "topology")
            seen.add(tuple(open(os.path.join(topo, f), encoding="ascii").read().strip()
                           for f in ("physical_package_id", "core_id")))
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
    llc_bytes: int

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
    wanted = max(-(-multiple * llc // MiB) * MiB, DRAM_FLOOR_BYTES[device.type])
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
        lines = [
            f"CPU    {self.cpu_model}, {self.num_cores} cores, {self.num_cpus} threads, {self.ram_bytes / GiB:.0f} GiB RAM",
            f"Cache  {self.caches.describe()}",
            f"GPU    {gpu}",
            f"OS     {self.os}",
            f"Python {self.python}, torch {self.torch} ({threads}, BLAS {self.blas})",
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


# --------------------------------------------------------------------------- probes


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
    size: int
    dtype: str
    timing: Timing
    threads: int | None = None

    @property
    def flops(self) -> int:
        return 2 * self.size**3  # one multiply and one add per (row, column, inner) triple

    @property
    def gflops(self) -> float:
        return self.flops / self.timing.median_s / 1e9

    @property
    def best_gflops(self) -> float:
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
