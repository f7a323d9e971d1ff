"""Swap or recompute (chapter 8): the A100's host link, the break-even request length, and ``bench()``.

A preempted request of ``L`` tokens costs, when it resumes:

- by recomputation, a prefill of its ``L`` tokens inside a step: ``per_seq_s + L x per_prefill_s``
  of the step model (:func:`kvlib.serving.roofline.roofline_step_model`), its compute at peak:
  what it adds to a step bound by compute. The book's step model takes the larger of a step's
  memory and compute times, so in a decode step bound by memory a short recomputation adds
  nothing until its compute outlasts the reads (:func:`free_prefill_tokens`);
- by swapping, two copies over the host link, out and back in:
  ``2 x (per_transfer_s + L x bytes_per_token / bandwidth)`` (:class:`~kvlib.serving.swap.SwapTimeModel`).

Both grow linearly in ``L``. Their slopes decide which is cheaper for long requests; their
fixed parts (one sequence's compute for recomputation; the copies' launches and
synchronisation for swapping) decide the short ones. :func:`break_even` returns both lines
and where they cross, ``L* = (swap_fixed - recompute_fixed) / (recompute_slope - swap_slope)``.

The A100's link (:func:`a100_swap_model`): PCIe 4.0 x16 carries 16 GT/s per lane with
128b/130b encoding, 31.5 GB/s each way (PCI-SIG, PCIe 4.0 base specification; NVIDIA's
A100 data sheet lists 64 GB/s for both directions); pinned copies achieve about 80% of it,
25 GB/s, which we take. :func:`measure_copy_bandwidth` measures the copy on this machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import require_int, require_real
from kvlib.measure.hardware import dram_bytes
from kvlib.measure.timing import pick_device, synchronize, time_it
from kvlib.serving.roofline import roofline_step_model
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.swap import SwapTimeModel
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import bytes_per_token

PCIE4_X16_BYTES_PER_S = 16e9 * 16 * 128 / 130 / 8  # 31.5 GB/s each way: 16 GT/s x 16 lanes, 128b/130b

A100_LINK_BYTES_PER_S = 25e9  # achieved by pinned copies over it: about 80% (an assumption, stated)

COPY_CALL_S = 5e-6  # launch and completion of one host-device copy call (an assumption: a few µs)


def a100_swap_model(model: str = "OPT-13B", bandwidth: float = A100_LINK_BYTES_PER_S) -> SwapTimeModel:
    """Copies of a catalog model's fp16 K/V over the A100's PCIe 4.0 x16 link.

    Each copy is one call per layer for K and one for V (the blocks of a layer gathered, as
    :class:`~kvlib.serving.swap.HostPool` does), each :data:`COPY_CALL_S`: the fixed part.
    """
    entry = catalog_entry(model)
    bandwidth = require_real(bandwidth, "bandwidth (bytes/s)", positive=True)
    return SwapTimeModel(
        bytes_per_token(entry.spec),
        bandwidth,
        per_transfer_s=2 * entry.spec.num_layers * COPY_CALL_S,
        source=f"{model} over PCIe 4.0 x16 at {bandwidth / 1e9:.0f} GB/s, "
        f"{COPY_CALL_S * 1e6:.0f} µs per copy call",
    )


@dataclass(frozen=True)
class BreakEven:
    """Recompute and swap costs of resuming a preempted request, two lines in its length L (seconds)."""

    recompute_fixed_s: float  # per_seq_s: the recomputed sequence's share of its step
    recompute_per_token_s: float  # per_prefill_s
    swap_fixed_s: float  # 2 x per_transfer_s: out and back in
    swap_per_token_s: float  # 2 x bytes_per_token / bandwidth
    tie_bandwidth: float  # link bytes/s at which the slopes are equal (slower: recomputation wins long ones)

    @property
    def crossing_tokens(self) -> float:
        """L where the two lines meet (``inf`` for parallel lines; <= 0: one mode wins at every length)."""
        slopes = self.recompute_per_token_s - self.swap_per_token_s
        return math.inf if slopes == 0 else (self.swap_fixed_s - self.recompute_fixed_s) / slopes

    @property
    def cheaper_for_long(self) -> str:
        """The mode with the smaller slope: the cheaper one for long enough requests."""
        return "swap" if self.swap_per_token_s < self.recompute_per_token_s else "recompute"

    def recompute_s(self, num_tokens) -> float:
        """Seconds to resume a request of ``num_tokens`` tokens by recomputation."""
        return self.recompute_fixed_s + self.recompute_per_token_s * num_tokens

    def swap_s(self, num_tokens) -> float:
        """Seconds to resume it by swapping (out and in)."""
        return self.swap_fixed_s + self.swap_per_token_s * num_tokens


def break_even(step_model: StepTimeModel | None = None, swap_model: SwapTimeModel | None = None) -> BreakEven:
    """The two cost lines of :class:`BreakEven` (defaults: OPT-13B on the A100, :func:`a100_swap_model`)."""
    step_model = roofline_step_model() if step_model is None else step_model
    swap_model = a100_swap_model() if swap_model is None else swap_model
    if not isinstance(step_model, StepTimeModel) or not isinstance(swap_model, SwapTimeModel):
        raise KVLibError("break_even needs a StepTimeModel and a SwapTimeModel")
    if step_model.per_prefill_s <= 0:
        raise KVLibError("the step model's per_prefill_s is 0: recomputation would cost nothing")
    return BreakEven(
        recompute_fixed_s=step_model.per_seq_s,
        recompute_per_token_s=step_model.per_prefill_s,
        swap_fixed_s=2 * swap_model.per_transfer_s,
        swap_per_token_s=2 * swap_model.bytes_per_token / swap_model.bandwidth,
        tie_bandwidth=2 * swap_model.bytes_per_token / step_model.per_prefill_s,
    )


def free_prefill_tokens(
    step_model: StepTimeModel | None = None, num_seqs: int = 0, context_tokens: int = 0
) -> float:
    """Prompt tokens a step of ``num_seqs`` decodes reading ``context_tokens`` cached tokens can prefill
    before its compute outlasts its memory reads, under an overlapped step model (default: OPT-13B on
    the A100): ``(memory part - the decodes' compute) / per_prefill_s``. With no decodes, the tokens
    whose FLOPs take as long as one read of the weights. 0 for a summed model: every token adds."""
    step_model = roofline_step_model() if step_model is None else step_model
    if not isinstance(step_model, StepTimeModel):
        raise KVLibError(f"step_model must be a StepTimeModel, not {type(step_model).__name__}")
    num_seqs = require_int(num_seqs, "num_seqs", 0)
    context_tokens = require_int(context_tokens, "context_tokens", 0)
    if not step_model.overlapped:
        return 0.0
    if step_model.per_prefill_s <= 0:
        return math.inf
    memory = (
        step_model.fixed_s
        + step_model.per_context_s * context_tokens
        + step_model.per_seq_memory_s * num_seqs
    )
    return max(0.0, (memory - step_model.per_seq_s * num_seqs) / step_model.per_prefill_s)


def swap_vs_recompute_break_even_tokens(
    step_model: StepTimeModel | None = None, swap_model: SwapTimeModel | None = None
) -> float:
    """The request length (tokens) above which the mode with the smaller slope costs less to resume
    (:meth:`BreakEven.crossing_tokens`; ``inf`` for parallel lines, <= 0 when it wins at every length)."""
    return break_even(step_model, swap_model).crossing_tokens


def measure_copy_bandwidth(num_bytes: int | None = None, device=None, repeats: int = 5) -> dict:
    """Bytes per second of copies between host memory and ``device`` (default :func:`pick_device`),
    through :func:`kvlib.measure.time_it`: ``{"to_host": ..., "to_device": ...}``.

    On a GPU the host side is pinned, as :class:`~kvlib.serving.swap.HostPool`'s; on a CPU both
    sides are host memory (a memory copy). ``num_bytes`` defaults to
    :func:`~kvlib.measure.hardware.dram_bytes` (four times the last-level cache), so that on a
    CPU the copy reads and writes DRAM, not a cache that a fixed 64 MiB would fit in on some
    machines. Not for tests: it times.
    """
    device = pick_device() if device is None else torch.device(device)
    num_bytes = dram_bytes(device) if num_bytes is None else require_int(num_bytes, "num_bytes")
    pin = device.type == "cuda"
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=pin)
    dev = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    out = {
        "to_host": time_it(lambda: host.copy_(dev), repeats=repeats, device=device),
        "to_device": time_it(lambda: dev.copy_(host), repeats=repeats, device=device),
    }
    synchronize(device)
    return {name: num_bytes / timing.median_s for name, timing in out.items()}


def swap_tokens_identical(model=None, num_requests: int = 12) -> bool:
    """Does the real engine generate, under swapping, every request's tokens as under recomputation,
    and each its solo tokens? A KV budget of 64 slots (blocks of 4) preempts many times."""
    from kvlib.chapters.ch04_serving.policy_comparison import engine_model
    from kvlib.serving.engine import outputs_match_solo, run_engine
    from kvlib.serving.scheduler import SchedulerConfig
    from kvlib.serving.traces import TraceSpec, make_trace

    model = engine_model() if model is None else model
    spec = TraceSpec("swap", 12, 24, max_len=64)
    requests = make_trace(spec, num_requests, math.inf, seed=3, vocab_size=model.config.vocab_size)
    runs = [
        run_engine(model, requests, "paged", 64, 64, block_size=4, config=config, progress=False)
        for config in (SchedulerConfig(), SchedulerConfig(preemption_mode="swap", num_host_blocks=8))
    ]
    same = [s.generated for s in runs[0].finished] == [s.generated for s in runs[1].finished]
    return same and sum(s.num_swaps for s in runs[1].finished) > 0 and outputs_match_solo(model, runs[1])


def bench() -> dict:
    """Chapter 8's swapping benchmarks: the A100 break-even and the real engine's tokens."""
    line = break_even()
    return {
        "swap_vs_recompute_break_even_tokens": round(line.crossing_tokens, 1),
        "swap_vs_recompute_tie_bandwidth_gb_s": round(line.tie_bandwidth / 1e9, 2),
        "swap_tokens_identical": swap_tokens_identical(),
    }
