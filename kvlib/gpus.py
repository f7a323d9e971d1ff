"""GPU data sheets the chapters share: the vLLM paper's A100, a 32 GB consumer GPU, a server's memory share.

The paper serves OPT-13B on one NVIDIA A100 with 40 GB (Kwon et al. 2023). Chapter 4's
KV budget and roofline step times (:mod:`kvlib.serving.roofline`) and chapter 5's lever
chain (:mod:`kvlib.chapters.ch05_levers.levers`) read the same figures from here: memory, HBM bandwidth and
dense fp16 compute (:class:`GPU`), and the fraction of memory a vLLM server uses by
default (:data:`MEMORY_FRACTION`). Chapter 2 sets :data:`RTX_5090`, a 32 GB consumer GPU of the
kind the source article's author works on, beside the A100s and H100s of its capacity examples.
Plain constants, no torch, so any layer may import them.
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

# A 32 GB consumer GPU, the source article's setting ("a GPU of the 32 GB VRAM class"), for chapter 2.
# NVIDIA GeForce RTX 5090 data sheet (nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5090/, and the
# NVIDIA RTX Blackwell GPU architecture whitepaper, appendix): 32 GB of GDDR7 on a 512-bit interface at
# 28 Gbps, i.e. 512 / 8 x 28e9 = 1,792 GB/s; fp16 tensor-core peak 838 TFLOPS with 2:4 sparsity, so 419
# dense (with fp16 accumulation; GeForce cards accumulate in fp32 at a lower rate).
RTX_5090_BYTES = 32 * GiB  # GPU memory is sold in binary units: 32 GB of GDDR7 are 32 x 1024^3 bytes

RTX_5090_BANDWIDTH = 512 / 8 * 28e9  # bytes/s: bus width in bytes x data rate per pin = 1.792e12

RTX_5090_FP16_FLOPS = 838e12 / 2  # dense fp16 tensor-core peak: the data sheet's sparse figure, halved

RTX_5090 = GPU("NVIDIA GeForce RTX 5090", RTX_5090_BYTES, RTX_5090_BANDWIDTH, RTX_5090_FP16_FLOPS)
