"""GPU data sheets that chapters 4 and 5 share: the vLLM paper's A100 and a server's memory share.

The paper serves OPT-13B on one NVIDIA A100 with 40 GB (Kwon et al. 2023). Chapter 4's
KV budget and roofline step times (:mod:`kvlib.serving.gpu_model`) and chapter 5's lever
chain (:mod:`kvlib.levers`) read the same figures from here: memory, HBM bandwidth and
dense fp16 compute (:class:`GPU`), and the fraction of memory a vLLM server uses by
default (:data:`MEMORY_FRACTION`). Plain constants, no torch, so any layer may import them.
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


# The paper's GPU (chapters 4 and 5).
A100_40GB = GPU("NVIDIA A100 40GB", A100_BYTES, A100_BANDWIDTH, A100_FP16_FLOPS)
