"""How the numba kernels are compiled and run: their cache directory and their threads (chapters 1-4).

**Cache.**
numba's on-disk cache (``cache=True``) checks only the file that defines a compiled function.
The kernel of :mod:`kvlib.kernels.numba_decode` compiles in the loops of
:mod:`kvlib.kernels.numba_lanes`, :mod:`kvlib.kernels.numba_simd` and
:mod:`kvlib.kernels.numba_ops`, so after an edit or a ``git pull`` that changes only one of
those, numba would load the old kernel from its cache and run the old loops. :func:`cached_njit`
therefore caches every kernel function under ``__pycache__/numba-<fingerprint>`` beside these
modules, the fingerprint a hash of all their sources: a change to any of them means a new
directory and one fresh compilation. Where the reader sets ``NUMBA_CACHE_DIR``, numba's own
rule applies, and where the directory cannot be written, numba's next choice (its usual one).

**Threads.** :func:`numba_threads` ties numba's thread count to torch's, and
:func:`use_numba_threads` applies it before a kernel runs: one setting governs the whole
decode step.

**Compile time.** :func:`timed_first_call` times the first call of each kernel in this process
(compilation, or loading the cache), and :func:`jit_seconds` reports those times, so that a
chapter can say what compiling cost.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numba
import torch

# kernel name ("float32", "16-bit", "merge", "rows", ...) -> seconds of its first call in this process
_JIT_SECONDS: dict[str, float] = {}
_POOL_STARTED: list[bool] = []  # [True] once start_numba_threads has run in this process
KERNEL_SOURCES = (
    "numba_setup.py",
    "numba_ops.py",
    "numba_simd.py",
    "numba_lanes.py",
    "numba_decode.py",
    "numba_row_product.py",
)


def fingerprint(directory: Path | None = None) -> str:
    """First 12 hex digits of the SHA-256 of the kernel's source files (in ``directory``, default
    this package's), in ``KERNEL_SOURCES`` order."""
    directory = Path(__file__).parent if directory is None else directory
    digest = hashlib.sha256()
    for name in KERNEL_SOURCES:
        digest.update((directory / name).read_bytes())
    return digest.hexdigest()[:12]


def kernel_cache_dir() -> Path:
    """The directory the kernel's compiled code is cached in (unless ``NUMBA_CACHE_DIR`` is set)."""
    return Path(__file__).parent / "__pycache__" / f"numba-{fingerprint()}"


def cached_njit(**options):
    """``numba.njit(cache=True, **options)``, its cache in :func:`kernel_cache_dir`.

    numba picks a function's cache directory when it is decorated, from ``numba.config.CACHE_DIR``;
    this sets that for the one decoration and restores it, so other numba code is unaffected.
    """

    def decorate(function):
        saved = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = saved or str(kernel_cache_dir())
        try:
            return numba.njit(cache=True, **options)(function)
        finally:
            numba.config.CACHE_DIR = saved

    return decorate


def numba_threads() -> int:
    """Threads the kernels run on: torch's thread count (``torch.set_num_threads``, or
    :func:`kvlib.measure.timing.torch_threads`), capped by the threads numba started with.

    One setting governs both libraries, so that "on one thread" means one thread for the whole
    step: a one-thread step timed by its thread's CPU time (chapters 1 and 4) must not hand
    half its attention to a second numba thread that the clock does not see.
    """
    return max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def use_numba_threads() -> int:
    """Set numba's thread count to :func:`numba_threads` (if it differs) and return it."""
    start_numba_threads()
    threads = numba_threads()
    if numba.get_num_threads() != threads:
        numba.set_num_threads(threads)
    return threads


def start_numba_threads() -> None:
    """Start numba's thread pool, keeping torch's thread count.

    numba starts its pool on its first parallel call or thread query; with its OpenMP layer, which
    PyTorch's CPU wheels share, that sets every OpenMP user's thread count to numba's maximum,
    torch's included. A chapter that set torch to one thread would run on all of them from its
    first numba kernel on (and a busy core would then stall every parallel region), so the pool is
    started here, once, and torch's count put back.
    """
    if _POOL_STARTED:
        return
    threads = torch.get_num_threads()
    numba.get_num_threads()  # starts the pool
    torch.set_num_threads(threads)
    _POOL_STARTED.append(True)


def timed_first_call(name: str, kernel, args: tuple) -> None:
    """Call ``kernel(*args)``; the first call of each ``name`` in this process is timed (it compiles,
    or loads numba's on-disk cache)."""
    if name in _JIT_SECONDS:
        kernel(*args)
        return
    start = time.perf_counter()
    kernel(*args)
    _JIT_SECONDS[name] = time.perf_counter() - start


def jit_seconds() -> dict[str, float]:
    """Seconds of the first call in this process of each kernel run so far: "float32" and "16-bit"
    (the decode kernel per storage), "merge" (split-K's), "rows" and "rows-parallel" (row_product's)."""
    return dict(_JIT_SECONDS)
