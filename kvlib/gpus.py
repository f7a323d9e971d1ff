"""Experiments of chapter 4: the KV budget of the vLLM paper's setup, the four policies on one
trace, step-time regimes, latency against request rate, and ``bench()`` for
``python -m kvlib bench``.

The paper serves OPT-13B on one NVIDIA A100 with 40 GB (Kwon et al. 2023). Our simulations
use the KV budget that setup leaves (:func:`kv_budget`), the lengths of its traces
(:mod:`kvlib.traces`), and a step-time model measured on this machine
(:func:`kvlib.engine.calibrate`). :func:`roofline_step` estimates the A100's step times
from its data sheet instead, so that both regimes can be set side by side; it is the one
A100 model of the book (chapter 5's :func:`kvlib.levers.roofline_step` applies it to each
variant of its lever chain).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib.units import GiB

A100_BYTES = 40 * GiB  # NVIDIA A100 40 GB, the paper's GPU

A100_BANDWIDTH = 1.555e12  # bytes/s of its HBM2 (NVIDIA data sheet)

A100_FP16_FLOPS = 312e12  # dense fp16 tensor-core peak (NVIDIA data sheet)

MEMORY_FRACTION = 0.9  # of GPU memory a vLLM server uses by default (gpu_memory_utilization)


@dataclass(frozen=True)
class GPU:
    """The data-sheet figures a roofline needs: memory, memory bandwidth, dense fp16 compute."""

    name: str
    memory_bytes: int
    bandwidth: float  # bytes/s
    fp16_flops: float  # dense tensor-core peak, FLOP/s


A100_40GB = GPU(
    "NVIDIA A100 40GB", A100_BYTES, A100_BANDWIDTH, A100_FP16_FLOPS
)  # the paper's GPU (chapters 4 and 5)
