"""Why fewer KV heads decode faster: one decode step's attention reads the whole cache (chapter 2).

At each generated token, every layer's attention has one query per sequence and must read
the whole K and V cache of that layer once. It does about 4 x num_heads x head_dim floating
point operations per cached token, against 2 x num_kv_heads x head_dim values read, so its
arithmetic intensity (FLOPs per byte) is tiny for MHA and grows with the group size
num_heads / num_kv_heads. Shazeer's argument for MQA (2019) is that the
time is set by the bytes read: time = K/V bytes / memory bandwidth. This module measures
that time for several numbers of KV heads and context lengths and turns it into achieved
GB/s (bytes read / time) and GFLOP/s, to set beside the bandwidth probe of
:func:`kvlib.measure.probes.memory_bandwidth` on a roofline plot.

Sizes come from the hardware (:func:`decode_setup`): at the longest context K and V each
exceed four times the last-level cache (else they are read from cache, faster than
memory), and on a GPU reading them also takes far longer than launching the kernels. On the CPU the
experiment runs on one thread, bandwidth probe included: on a shared machine a
multi-threaded kernel waits at each barrier for a descheduled thread, which makes a small
step as slow as a large one; one thread gives every configuration the same conditions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from kvlib import KVLibError
from kvlib.chapters.ch02_cache_size.decode_roofline import (
    DecodeMeasurement,
    kernel_sweep,
    roof_probes,
    split_k_speedup,
)
from kvlib.kernels.dispatch import default_kernel
from kvlib.measure.hardware import all_threads, available_memory_bytes, dram_bytes
from kvlib.measure.probes import launch_overhead_s, memory_bandwidth
from kvlib.measure.timing import clock_for, pick_device, time_interleaved, time_it, torch_threads
from kvlib.model.attention import grouped_attention, repeat_kv_attention, sdpa_attention
from kvlib.sizing.spec import kv_cache_bytes
from kvlib.units import ceil_div

IMPLEMENTATIONS = {"grouped": grouped_attention, "repeat": repeat_kv_attention, "sdpa": sdpa_attention}


@dataclass(frozen=True)
class DecodeSetup:
    """Shapes of the decode-attention experiment on one device."""

    device: torch.device
    dtype: torch.dtype
    batch: int  # sequences decoded at once
    contexts: tuple[int, ...]  # cached tokens per sequence, ascending
    kv_heads: tuple[int, ...] = (32, 8, 4, 1)  # num_kv_heads compared: MHA, two GQA, MQA
    num_heads: int = 32  # query heads (Llama-2-7B's)
    head_dim: int = 128
    threads: int | None = None  # torch threads while timing (None: leave torch's setting)
    kernel: str | None = None  # the kvlib.kernels kernel timed (None: PyTorch's attention, chapter 1's)

    @property
    def longest(self) -> int:
        """The longest context measured."""
        return self.contexts[-1]

    @property
    def clock(self) -> str:
        """The thread's CPU time on one CPU thread (a busy machine cannot stretch it), else the wall clock."""
        return clock_for(self.device, self.threads)

    def describe(self) -> str:
        """One line naming the device, dtype, batch, heads, contexts and threads."""
        threads = (
            "torch's threads" if self.threads is None else f"{self.threads} thread{'s' * (self.threads > 1)}"
        )
        contexts = ", ".join(f"{c:,}" for c in self.contexts)
        kernel = f", kernel {self.kernel}" if self.kernel else ""
        return (
            f"{self.device.type}, {str(self.dtype).removeprefix('torch.')}, batch {self.batch}, "
            f"{self.num_heads} query heads of {self.head_dim}, KV heads {self.kv_heads}, "
            f"contexts {contexts}, {threads}{kernel}"
        )


# Fewest tokens of the longest context: short contexts are dominated by per-call costs.
DECODE_MIN_LONGEST = {"cpu": 16384, "cuda": 4096}

# On a GPU one MHA step must read for this many kernel launches' worth of time, so that the
# five kernels of a decode step cost under 5% of it.
GPU_LAUNCHES_PER_STEP = 100


def longest_context(bytes_per_token: int, min_bytes: int, min_tokens: int) -> int:
    """The smallest power of two >= ``min_tokens`` whose cache holds at least ``min_bytes``."""
    if bytes_per_token < 1 or min_bytes < 0 or min_tokens < 1:
        raise KVLibError("bytes_per_token and min_tokens must be positive and min_bytes non-negative")
    tokens = max(min_tokens, ceil_div(min_bytes, bytes_per_token))
    return 1 << (tokens - 1).bit_length()


def decode_setup(device: torch.device | str | None = None, threads: int | None = 1) -> DecodeSetup:
    """Per-device sizes, chosen from the hardware (chapter 2 explains the choice).

    CPU: float32 (what its matmul kernels are fast at), batch 1, ``threads`` torch threads
    (default one, see the module docstring). The longest context is the shortest whose MHA
    K, and V, each reach :func:`kvlib.measure.hardware.dram_bytes` (four times the last-level cache,
    so both are read from DRAM; at least 16K tokens); the others are a quarter and a
    sixteenth of it, and may partly fit in the cache.
    GPU: float16, batch 8; MHA's K+V must also take ``GPU_LAUNCHES_PER_STEP`` kernel
    launches' time to read at the probed bandwidth, so launches do not decide the time.
    """
    device = pick_device() if device is None else torch.device(device)
    if device.type == "cuda":
        setup = DecodeSetup(device, torch.float16, batch=8, contexts=(1,))
        per_token = kv_cache_bytes(1, setup.num_heads, setup.head_dim, 1, setup.batch, dtype_bytes=2)  # MHA
        read_bytes = (
            GPU_LAUNCHES_PER_STEP
            * launch_overhead_s(device)
            * memory_bandwidth(device=device).best_gbps
            * 1e9
        )
        min_bytes = min(max(dram_bytes(device), int(read_bytes)), available_memory_bytes(device) // 4)
    else:
        setup = DecodeSetup(device, torch.float32, batch=1, contexts=(1,), threads=threads)
        per_token = kv_cache_bytes(1, setup.num_heads, setup.head_dim, 1, setup.batch, dtype_bytes=4)  # MHA
        min_bytes = 2 * dram_bytes(device)  # K and V are read by separate products: each from DRAM
    longest = longest_context(per_token, min_bytes, DECODE_MIN_LONGEST[device.type])
    return replace(setup, contexts=(longest // 16, longest // 4, longest))


def kernel_setup(device: torch.device | str | None = None, kernel: str | None = None) -> DecodeSetup:
    """:func:`decode_setup`'s shapes for :func:`kvlib.kernels.decode_attention` (``kernel``: None = the
    device's default): on a CPU on all threads, as the numba kernel runs, and so its probes."""
    setup = decode_setup(device)
    kernel = default_kernel(setup.device) if kernel is None else kernel
    threads = all_threads() if setup.device.type == "cpu" else None
    return replace(setup, threads=threads, kernel=kernel)


def decode_inputs(setup: DecodeSetup, num_kv_heads: int, context: int, seed: int = 0):
    """q (batch, heads, 1, head_dim) and a cache k, v (batch, kv_heads, context, head_dim), seeded."""
    if num_kv_heads < 1 or setup.num_heads % num_kv_heads:
        raise KVLibError(f"num_kv_heads must divide num_heads ({setup.num_heads}), not {num_kv_heads}")
    if context < 1:
        raise KVLibError(f"context must be a positive number of tokens, not {context}")
    generator = torch.Generator(setup.device).manual_seed(seed)

    def tensor(heads, length):
        shape = (setup.batch, heads, length, setup.head_dim)
        return torch.empty(shape, device=setup.device, dtype=setup.dtype).uniform_(-1, 1, generator=generator)

    return tensor(setup.num_heads, 1), tensor(num_kv_heads, context), tensor(num_kv_heads, context)


def _calls_per_sample(fn, device, target_s: float) -> int:
    """How many back-to-back calls make one timing sample last about ``target_s`` (warms ``fn`` up too)."""
    once = time_it(fn, repeats=1, warmup=1, device=device).median_s
    return max(1, math.ceil(target_s / max(once, 1e-7)))


def time_decode(setup: DecodeSetup, q, k, v, impl: str = "grouped", repeats: int = 5) -> DecodeMeasurement:
    """Time ``impl`` on given inputs (median of ``repeats`` samples of >= ~10 ms each)."""
    if impl not in IMPLEMENTATIONS:
        raise KVLibError(
            f"unknown attention implementation {impl!r}; choose from {', '.join(IMPLEMENTATIONS)}"
        )
    attention = IMPLEMENTATIONS[impl]

    def step():
        return attention(q, k, v, q_start=k.shape[2] - 1)

    with torch.inference_mode(), torch_threads(setup.threads):
        number = _calls_per_sample(step, setup.device, target_s=0.01)
        timing = time_it(
            step, repeats=repeats, warmup=0, number=number, device=setup.device, clock=setup.clock
        )
    return DecodeMeasurement(
        impl, k.shape[1], k.shape[2], setup.batch, setup.num_heads, setup.head_dim, k.element_size(), timing
    )


def measure_decode(
    setup: DecodeSetup, num_kv_heads: int, context: int, impl: str = "grouped", repeats: int = 5
) -> DecodeMeasurement:
    """Allocate a seeded cache of ``num_kv_heads`` x ``context`` and time one decode step on it."""
    q, k, v = decode_inputs(setup, num_kv_heads, context)
    return time_decode(setup, q, k, v, impl, repeats)


def sweep(setup: DecodeSetup, impl: str = "grouped", repeats: int = 5) -> list[DecodeMeasurement]:
    """Every (context, KV heads) pair of the setup, one cache allocated at a time."""
    return [
        measure_decode(setup, kv, context, impl, repeats)
        for context in setup.contexts
        for kv in setup.kv_heads
    ]


def compare_implementations(
    setup: DecodeSetup, num_kv_heads: int, context: int, repeats: int = 5
) -> list[DecodeMeasurement]:
    """Grouped, repeat-K/V and SDPA attention on the same cache, after checking that they agree.

    They are timed in ``repeats`` interleaved rounds (:func:`~kvlib.measure.timing.time_interleaved`,
    the setup's clock and threads, samples of at least ~10 ms), so that a ratio of two of them can be
    taken round by round (:func:`~kvlib.measure.timing.round_median`): load that lasts a round slows
    them alike.
    """
    q, k, v = decode_inputs(setup, num_kv_heads, context)
    reference = grouped_attention(q, k, v, q_start=context - 1).float()
    for impl, attention in IMPLEMENTATIONS.items():
        out = attention(q, k, v, q_start=context - 1).float()
        if not torch.allclose(out, reference, atol=2e-3, rtol=2e-3):
            raise KVLibError(
                f"{impl} attention disagrees with grouped attention by {(out - reference).abs().max():.2e}"
            )
    del out, reference
    steps = {
        impl: (lambda attention=attention: attention(q, k, v, q_start=context - 1))
        for impl, attention in IMPLEMENTATIONS.items()
    }
    with torch.inference_mode(), torch_threads(setup.threads):
        timings = time_interleaved(
            steps, rounds=repeats, target_s=0.01, warmup=0, device=setup.device, clock=setup.clock
        )
    shape = k.shape[1], k.shape[2], setup.batch, setup.num_heads, setup.head_dim, k.element_size()
    return [DecodeMeasurement(impl, *shape, timing) for impl, timing in timings.items()]


def bench() -> dict:
    """Benchmarks of chapter 2 for ``python -m kvlib bench``: the kernel at the longest context of
    :func:`kernel_setup` on the roofline, split-K for MQA, and PyTorch's grouped against repeat-K/V."""
    setup = kernel_setup()
    at_longest = replace(setup, contexts=(setup.longest,))
    runs = {m.num_kv_heads: m for m in kernel_sweep(at_longest, roof_probes(at_longest))}
    split = split_k_speedup(setup)
    torch_setup = decode_setup()
    q, k, v = decode_inputs(torch_setup, 8, torch_setup.longest)
    gqa8 = time_decode(torch_setup, q, k, v, "grouped")
    repeat = time_decode(torch_setup, q, k, v, "repeat")
    return {
        "kernel": setup.kernel,
        "decode_attn_bw_fraction": round(runs[32].bw_fraction, 3),
        "decode_roofline_fraction": {str(kv): round(m.roofline_fraction, 3) for kv, m in runs.items()},
        "split_k_speedup_mqa": round(split.speedup, 2),
        "gqa8_speedup": round(runs[32].timing.median_s / runs[8].timing.median_s, 2),
        "mqa_speedup": round(runs[32].timing.median_s / runs[1].timing.median_s, 2),
        "grouped_vs_repeat_speedup": round(repeat.timing.median_s / gqa8.timing.median_s, 2),
    }
