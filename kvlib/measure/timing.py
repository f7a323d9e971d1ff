"""How kvbook times: one timer, interleaved rounds for comparisons, the clocks, devices and threads.

Every measuring chapter times through :func:`time_it`, so all numbers in the book are taken
the same way: warm-up calls first, CUDA synchronised around every sample, several repeats,
and the median reported with the min and max beside it (:class:`Timing`). Chapters 1, 3
and 6 compare functions by :func:`time_interleaved` (rounds in which each runs once, in
rotating turns) and :func:`round_median`. On one CPU thread work is timed by the thread's
CPU time (:func:`clock_for`), which a busy machine cannot stretch. :func:`pick_device` and
:func:`torch_threads` choose where and on how many threads. The chapter "How to read the
measurements" (``book/00_measurements.ipynb``) introduces them.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import require_int


def one_cpu_thread(device: torch.device):
    """Run torch on one thread on the CPU (no change on a GPU).

    On a shared two-core machine a second thread is often descheduled, and every parallel
    operation then waits for it (chapter 3): tiny models run many times slower.
    """
    return torch_threads(1 if torch.device(device).type == "cpu" else None)


# Bounds on what one timing may ask for: a sample of 10**12 calls, or 10**12 repeats, would not end.
MAX_REPEATS = 10_000  # repeats, warm-up calls or rounds
MAX_NUMBER = 10_000_000  # back-to-back calls in one sample
MAX_TARGET_S = 60.0  # seconds one sample of time_interleaved may aim at
MAX_THREADS = 1024


def _checked_device(device) -> torch.device | None:
    """``device`` as a torch.device (None stays None), or a one-line KVLibError naming it."""
    if device is None or isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise KVLibError(
            f"device must be a torch device such as 'cpu' or 'cuda', not {device!r}"[:200]
        ) from None


def _checked_count(value, name: str, low: int, high: int) -> int:
    return require_int(value, name, low=low, high=high)


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
    device = _checked_device(device)
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    elif device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one timed function: median, min and max over the repeats."""

    median_s: float
    min_s: float
    max_s: float
    samples: tuple[float, ...]  # seconds per call of every repeat, in the order taken

    @property
    def spread(self) -> float:
        """max / min: how noisy the repeats were (1.0 means identical)."""
        return self.max_s / self.min_s if self.min_s > 0 else float("inf")

    def __str__(self) -> str:
        spread = f"min {_fmt_s(self.min_s)}, max {_fmt_s(self.max_s)}, n={len(self.samples)}"
        return f"{_fmt_s(self.median_s)} ({spread})"


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
    _checked_count(threads, "threads", 1, MAX_THREADS)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


CLOCKS = ("wall", "thread")  # time.perf_counter, time.thread_time


def read_clock(clock: str = "wall") -> float:
    """Seconds on ``clock``: the wall clock, or the CPU time of the calling thread (see :func:`time_it`)."""
    if clock not in CLOCKS:
        raise KVLibError(f"clock must be one of {', '.join(CLOCKS)}, not {clock!r}"[:200])
    return time.thread_time() if clock == "thread" else time.perf_counter()


def clock_for(device: torch.device | str, threads: int | None) -> str:
    """The clock that times work on ``device`` with ``threads`` torch threads fairly on a busy machine:
    the thread's CPU time for one CPU thread (it runs on the caller), else the wall clock."""
    device = _checked_device(device)
    if device is None:
        raise KVLibError("device must be a torch device such as 'cpu' or 'cuda', not None")
    if threads is not None:
        _checked_count(threads, "threads", 1, MAX_THREADS)
    return "thread" if device.type == "cpu" and threads == 1 else "wall"


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
    if not callable(fn):
        raise KVLibError(f"fn must be a function to call, not {type(fn).__name__}")
    _checked_count(repeats, "repeats", 1, MAX_REPEATS)
    _checked_count(warmup, "warmup", 0, MAX_REPEATS)
    _checked_count(number, "number", 1, MAX_NUMBER)
    if clock not in CLOCKS:
        raise KVLibError(f"clock must be one of {', '.join(CLOCKS)}, not {clock!r}"[:200])
    device = _checked_device(device)
    if clock == "thread" and device is not None and device.type != "cpu":
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
    if not isinstance(fns, Mapping) or not all(callable(fn) for fn in fns.values()):
        raise KVLibError(f"fns must map names to functions to call, not {type(fns).__name__}")
    if not fns:
        raise KVLibError("time_interleaved needs at least one function to time")
    _checked_count(rounds, "rounds", 1, MAX_REPEATS)
    _checked_count(warmup, "warmup", 0, MAX_REPEATS)
    if number is not None:
        _checked_count(number, "number", 1, MAX_NUMBER)
    if target_s is not None and (
        isinstance(target_s, bool)
        or not isinstance(target_s, int | float)
        or not 0 <= target_s <= MAX_TARGET_S  # NaN fails this too; 0: one call per sample
    ):
        raise KVLibError(f"target_s must be seconds from 0 to {MAX_TARGET_S:g}, not {target_s!r}"[:200])
    if clock is not None and clock not in CLOCKS:
        raise KVLibError(f"clock must be one of {', '.join(CLOCKS)}, not {clock!r}"[:200])
    device = pick_device() if device is None else _checked_device(device)
    clock = clock or clock_for(device, torch.get_num_threads())

    def sample(fn, calls: int) -> float:
        return time_it(fn, repeats=1, warmup=0, number=calls, device=device, clock=clock).min_s

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if number is None:
        once = {name: sample(fn, 1) for name, fn in fns.items()}
        target = max(0.01, *once.values()) if target_s is None else target_s
        numbers = {name: min(MAX_NUMBER, max(1, round(target / max(t, 1e-7)))) for name, t in once.items()}
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
    if not callable(expression) or not all(isinstance(t, Timing) for t in timings):
        raise KVLibError("round_median takes a function and the Timings of time_interleaved")
    if not timings or len({len(t.samples) for t in timings}) != 1:
        raise KVLibError("round_median needs timings with the same number of rounds")
    rounds = zip(*(t.samples for t in timings), strict=True)  # lengths checked above
    return statistics.median(expression(*values) for values in rounds)
