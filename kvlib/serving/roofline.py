"""A GPU from its data sheet (chapters 4 and 5): the KV budget a model leaves on it, its ideal step time.

The vLLM paper serves OPT-13B on one NVIDIA A100 with 40 GB (Kwon et al. 2023; the data
sheets are in :mod:`kvlib.gpus`). :func:`kv_budget` turns a catalog model (chapter 2's
byte formulas, :mod:`kvlib.sizing`) into the KV blocks such a GPU leaves beside its
weights: chapter 4 simulates in that budget. :func:`roofline_step` estimates a step's
time on the GPU from its data sheet, as a :class:`~kvlib.serving.step_time.StepTimeModel`,
so that the A100's regime can be set beside the one measured on this machine; it is the
book's one GPU model: chapter 5's :func:`kvlib.chapters.ch05_levers.levers.variant_step_model` applies it to
each variant of its lever chain, and :func:`kvlib.chapters.ch05_levers.levers.variant_kv_budget` generalises
:func:`kv_budget`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.checks import require_int, require_real
from kvlib.gpus import A100_40GB, A100_BYTES, GPU, MEMORY_FRACTION
from kvlib.serving.step_time import StepTimeModel
from kvlib.sizing.capacity import kv_budget_bytes, weight_bytes
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import bytes_per_token
from kvlib.units import GiB


@dataclass(frozen=True)
class KVBudget:
    """How many KV blocks a model leaves on one GPU: (memory x fraction - weights) / bytes per block."""

    model: str  # the model's (or the lever chain's variant's) name
    gpu_bytes: int  # memory of the GPU
    weight_bytes: int  # its fp16 weights
    kv_bytes: int  # what is left for the KV cache: gpu_bytes x memory fraction - weights (- fixed states)
    bytes_per_token: int  # K/V bytes of one cached token, over all layers
    block_size: int  # tokens per KV block
    num_blocks: int  # whole blocks that fit in kv_bytes

    @property
    def num_slots(self) -> int:
        """Token slots of the budget: whole blocks x block size."""
        return self.num_blocks * self.block_size


def kv_budget(
    model: str = "OPT-13B",
    gpu_bytes: int = A100_BYTES,
    memory_fraction: float = MEMORY_FRACTION,
    block_size: int = 16,
) -> KVBudget:
    """The KV budget of a catalog model in fp16 on one GPU (kvlib.sizing's numbers, chapter 2).

    ``memory_fraction`` is vLLM's ``--gpu-memory-utilization``, a share in (0, 1].
    """
    gpu_bytes, block_size = require_int(gpu_bytes, "gpu_bytes"), require_int(block_size, "block_size")
    if not 0 < require_real(memory_fraction, "memory_fraction") <= 1:
        raise KVLibError(f"memory_fraction is a share of the GPU in (0, 1], not {memory_fraction!r}")
    entry = catalog_entry(model)
    weights = weight_bytes(entry.num_parameters, "fp16")
    kv = kv_budget_bytes(gpu_bytes, weights, memory_fraction)
    per_token = bytes_per_token(entry.spec)
    if kv < per_token * block_size:
        raise KVLibError(f"{model} leaves no room for a KV block on a GPU of {gpu_bytes / GiB:.0f} GiB")
    return KVBudget(model, gpu_bytes, weights, kv, per_token, block_size, kv // (per_token * block_size))


def roofline_step(
    num_parameters: int,
    bytes_per_token: int,
    state_bytes: int = 0,
    gpu: GPU = A100_40GB,
    name: str = "a model",
    overlapped: bool = True,
) -> StepTimeModel:
    """An ideal step on ``gpu`` from its data sheet, not a measurement: the larger of its memory
    time and its compute time, as on a roofline (the book's one GPU step model, chapters 4, 5, 8).

    A decode step reads every fp16 weight once (fixed) and each cached token's K/V once (per
    context token), and reads and writes each sequence's fixed state, if it has one (a Mamba
    layer's state, chapter 5); every sequence computes 2 x parameters FLOPs for its token at
    peak speed, and prefill 2 x parameters FLOPs per prompt token. A GPU overlaps the two, so a
    step takes the larger; data-sheet peaks make it an optimistic estimate. ``overlapped=False``
    adds them instead (at most 2x slower): chapter 8 shows why that misleads about chunked prefill.
    """
    for key, value, low in (
        ("num_parameters", num_parameters, 1),
        ("bytes_per_token", bytes_per_token, 1),
        ("state_bytes", state_bytes, 0),
    ):
        require_int(value, key, low)
    flops_per_token = 2 * num_parameters / gpu.fp16_flops
    return StepTimeModel(
        fixed_s=weight_bytes(num_parameters, "fp16") / gpu.bandwidth,
        per_seq_s=flops_per_token,
        per_context_s=bytes_per_token / gpu.bandwidth,
        per_prefill_s=flops_per_token,
        source=f"{name} on an {gpu.name}, roofline" + ("" if overlapped else " (memory + compute)"),
        overlapped=overlapped,
        per_seq_memory_s=2 * state_bytes / gpu.bandwidth,
    )


def roofline_step_model(
    model: str = "OPT-13B", gpu: GPU = A100_40GB, overlapped: bool = True
) -> StepTimeModel:
    """:func:`roofline_step` of a catalog model with its fp16 cache (chapter 4: OPT-13B on the
    paper's A100)."""
    entry = catalog_entry(model)
    return roofline_step(
        entry.num_parameters, bytes_per_token(entry.spec), gpu=gpu, name=model, overlapped=overlapped
    )
