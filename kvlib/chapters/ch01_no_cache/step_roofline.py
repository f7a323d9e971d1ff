"""One decode step of the cached generation against its roofline bound (chapter 1's lean step).

A decode step of :class:`~kvlib.model.llama.TinyLlama` must read every weight once and the
K/V of every stored token, and do two FLOPs per weight and per stored K/V element per query
head. Its roofline bound is the larger of those bytes over the DRAM bandwidth and those
FLOPs over the matmul peak, both measured at the thread count the step runs on and by the
clock it is timed by (:func:`step_bandwidth`, :func:`matmul_probe`); whatever a step takes
beyond the bound is overhead (dispatching the step's operators from Python, memory the step
allocates, kernels below their peak).

:func:`step_work` counts the bytes and FLOPs (pure arithmetic), :func:`count_step_ops`
counts the operators one step dispatches and how many of them allocate, and
:func:`measure_decode_step` times steps of :class:`~kvlib.cache.generation.Decoder` and
returns a :class:`StepRoofline`: by default the lean step (:class:`~kvlib.model.lean.LeanLlama` on
the :class:`~kvlib.cache.fast_contiguous.FastContiguousKVCache`: fused projections, about half the
operators, none allocating), or with ``lean=False`` the readable step (the model's modules on
:class:`~kvlib.cache.contiguous.ContiguousKVCache`), so that chapter 1 can show what the lean step
saves. A tiny model's
weights may fit in the last-level cache (``StepRoofline.fits_llc``), in which case a step
need not read DRAM at all: so the bandwidth of the bound is that of a buffer of the step's own
size read again and again (:func:`step_bandwidth`), which streams from wherever that many bytes
stay between two reads, a cache level or DRAM, as the step's weights do between two steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvlib import KVLibError
from kvlib.cache.generation import Decoder
from kvlib.chapters.ch01_no_cache.costmodel import forward_flops
from kvlib.measure.hardware import cache_info
from kvlib.measure.probes import Bandwidth, Compute, memory_bandwidth
from kvlib.measure.timing import clock_for, pick_device, time_it, torch_threads
from kvlib.model.config import ModelConfig
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama


@dataclass(frozen=True)
class StepWork:
    """What one decode step must move and compute, whatever the implementation."""

    weight_bytes: int  # every weight read once: projections, norms, lm_head, one embedding row per sequence
    kv_read_bytes: int  # K and V of every key attended, every layer
    kv_write_bytes: int  # the new token's K and V, every layer
    flops: int  # forward_flops of one new token against num_keys keys

    @property
    def num_bytes(self) -> int:
        """All bytes the step moves to or from memory."""
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes


def step_work(config: ModelConfig, num_keys: int, batch: int = 1, dtype=torch.float32) -> StepWork:
    """Bytes and FLOPs of one decode step of ``batch`` sequences attending to ``num_keys`` keys each
    (the new token's included)."""
    if not isinstance(num_keys, int) or num_keys < 1 or not isinstance(batch, int) or batch < 1:
        raise KVLibError(f"num_keys and batch must be positive integers, not {num_keys!r} and {batch!r}")
    c, elem = config, torch.empty((), dtype=dtype).element_size()
    q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = c.d_model * (2 * q_width + 2 * kv_width) + 3 * c.d_model * c.d_ff + 2 * c.d_model
    weights = c.num_layers * per_layer + c.d_model + c.d_model * c.vocab_size + batch * c.d_model
    kv_token = 2 * c.num_layers * kv_width * elem  # K and V of one token, every layer
    return StepWork(
        weight_bytes=weights * elem,
        kv_read_bytes=batch * num_keys * kv_token,
        kv_write_bytes=batch * kv_token,
        flops=sum(forward_flops(config, 1, num_keys, batch).values()),
    )


def step_bandwidth(
    num_bytes: int, device: torch.device | str | None = None, threads: int | None = 1, repeats: int = 7
) -> Bandwidth:
    """The rate at which ``num_bytes`` stream when read again and again, at ``threads`` torch
    threads: :func:`~kvlib.measure.probes.memory_bandwidth` of a buffer of that size (at least
    4 KiB), timed by :func:`~kvlib.measure.timing.clock_for` (on one CPU thread its CPU time).

    A decode step reads the same weights at every step; between two steps they stay in the cache
    level that holds that many bytes, or in DRAM, and so does this buffer between two reads. Its
    rate is thus the memory roof for a step of ``num_bytes`` on any machine, whether or not the
    step fits the last-level cache (chapter 0's DRAM probe would be the wrong roof for one that does).
    """
    if not isinstance(num_bytes, int) or num_bytes < 1:
        raise KVLibError(f"num_bytes must be a positive integer, not {num_bytes!r}")
    device = pick_device() if device is None else torch.device(device)
    threads = threads if device.type == "cpu" else None
    size = max(4096, -(-num_bytes // 4) * 4)  # whole float32 elements, at least the probe's minimum
    return memory_bandwidth(size, device, repeats=repeats, threads=threads, clock=clock_for(device, threads))


def matmul_probe(
    device: torch.device | str | None = None,
    threads: int | None = 1,
    repeats: int = 15,
    size: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> Compute:
    """Chapter 0's matmul probe (the product and size of :func:`~kvlib.measure.probes.matmul_gflops`),
    timed by the clock the chapter times its steps by (:func:`~kvlib.measure.timing.clock_for`): on
    one CPU thread its CPU time, which another program's turns on the core do not stretch, so a
    busy machine cannot make the probe read low (a floor computed from it would then read high)."""
    device = pick_device() if device is None else torch.device(device)
    threads = threads if device.type == "cpu" else None
    size = size or (8192 if device.type == "cuda" else 1024)
    if not isinstance(size, int) or size < 16:
        raise KVLibError(f"size must be an integer of at least 16, not {size!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise KVLibError(f"repeats must be a positive integer, not {repeats!r}")
    generator = torch.Generator(device).manual_seed(0)
    a = torch.empty(size, size, device=device, dtype=dtype).uniform_(-1, 1, generator=generator)
    with torch_threads(threads):
        timing = time_it(
            lambda: a @ a, repeats=repeats, warmup=2, device=device, clock=clock_for(device, threads)
        )
    return Compute(str(device), size, str(dtype).removeprefix("torch."), timing, threads)


@dataclass(frozen=True)
class StepRoofline:
    """Measured seconds per decode step beside the step's roofline bound (:func:`measure_decode_step`)."""

    step_s: float  # seconds per decode step (fastest sample)
    work: StepWork  # bytes and FLOPs of one step
    bandwidth_bytes_per_s: float  # step_bandwidth: a buffer of the step's size, same thread count
    peak_flops_per_s: float  # matmul probe, same thread count
    threads: int | None  # torch threads of the step and the probes (None on a GPU)
    num_ops: int  # aten operators one step dispatches
    num_allocating_ops: int  # of which return a tensor in fresh memory
    llc_bytes: int  # last-level cache: a working set below it is not read from DRAM
    lean: bool = True  # the lean model on the fast cache ran; False: the readable model and cache

    @property
    def memory_s(self) -> float:
        """Seconds to move the step's bytes at the probe's rate (:func:`step_bandwidth`)."""
        return self.work.num_bytes / self.bandwidth_bytes_per_s

    @property
    def compute_s(self) -> float:
        """Seconds to do the step's FLOPs at the matmul probe's rate."""
        return self.work.flops / self.peak_flops_per_s

    @property
    def bound_s(self) -> float:
        """The roofline bound: max(bytes / bandwidth, FLOPs / peak)."""
        return max(self.memory_s, self.compute_s)

    @property
    def roofline_fraction(self) -> float:
        """bound / measured: 1.0 is a step at the roofline."""
        return self.bound_s / self.step_s

    @property
    def overhead_s(self) -> float:
        """Seconds per step beyond the bound (dispatch, allocation, kernels below peak); negative
        only where a probe read slower than the step (the chapter shows the fraction, not this)."""
        return self.step_s - self.bound_s

    @property
    def overhead_per_op_s(self) -> float:
        """The overhead shared among the step's operators."""
        return self.overhead_s / self.num_ops

    @property
    def fits_llc(self) -> bool:
        """Whether the step's bytes fit the last-level cache (then DRAM need not be read at all; the
        probe of :func:`step_bandwidth` then reads from the cache too)."""
        return self.work.num_bytes <= self.llc_bytes


class _OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched, and those whose outputs live in fresh storage."""

    def __init__(self):
        super().__init__()
        self.num_ops = 0
        self.num_allocating = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in _tensors(args) + _tensors(kwargs)}
        outputs = {t.untyped_storage().data_ptr() for t in _tensors(out)}
        self.num_ops += 1
        self.num_allocating += bool(outputs - inputs)
        return out


def _tensors(tree) -> list[torch.Tensor]:
    """Tensors found in nested tuples, lists and dicts."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, tuple | list):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


def count_step_ops(step: Callable[[], object]) -> tuple[int, int]:
    """(operators, allocating operators) that one call of ``step`` dispatches to aten.

    An operator allocates when one of its outputs lives in storage none of its inputs
    had (views and in-place writes do not). Deterministic: counted, not timed.
    """
    with _OpCounter() as counter:
        step()
    return counter.num_ops, counter.num_allocating


def measure_decode_step(
    model: TinyLlama,
    prompt: torch.Tensor,
    num_steps: int = 64,
    threads: int | None = 1,
    bandwidth: Bandwidth | None = None,
    compute: Compute | None = None,
    lean: bool = True,
) -> StepRoofline:
    """Time decode steps of ``model``'s cached generation after ``prompt`` against their bound.

    ``num_steps`` steps are timed one by one (fastest kept) after as many untimed ones, at
    ``threads`` torch threads; the bound is taken at the middle step's context, with the
    probes (:func:`step_bandwidth` of the step's bytes and :func:`matmul_probe`, measured here at
    the same threads and clock unless given) and the step's operators counted at that step.
    ``lean=False`` times the readable step (the modules on the readable cache); either way over
    ``model``'s weights (:meth:`~kvlib.model.llama.TinyLlama.sharing`), whichever class it is.
    """
    if not isinstance(num_steps, int) or num_steps < 1:
        raise KVLibError(f"num_steps must be a positive integer, not {num_steps!r}")
    device = prompt.device
    threads = threads if device.type == "cpu" else None
    if type(model) is not (LeanLlama if lean else TinyLlama):
        model = (LeanLlama if lean else TinyLlama).sharing(model)
    with torch_threads(threads):
        decoder = Decoder(model, prompt, 2 * num_steps + 1, mode="cache")
        for _ in range(num_steps):
            decoder.step()  # warm-up, untimed
        middle_keys = decoder.cache.length + num_steps // 2 + 1  # keys of the middle timed step
        work = step_work(model.config, middle_keys, prompt.shape[0], model.lm_head.weight.dtype)
        bandwidth = bandwidth or step_bandwidth(work.num_bytes, device, threads)
        compute = compute or matmul_probe(device, threads)
        clock = clock_for(device, threads)
        timings = [
            time_it(decoder.step, repeats=1, warmup=0, device=device, clock=clock).min_s
            for _ in range(num_steps)
        ]
        num_ops, num_allocating = count_step_ops(decoder.step)
    return StepRoofline(
        step_s=min(timings),
        work=work,
        bandwidth_bytes_per_s=bandwidth.best_gbps * 1e9,
        peak_flops_per_s=compute.best_gflops * 1e9,
        threads=threads,
        num_ops=num_ops,
        num_allocating_ops=num_allocating,
        llc_bytes=cache_info(device).llc_bytes,
        lean=lean,
    )
