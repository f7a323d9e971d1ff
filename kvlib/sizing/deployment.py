"""One model served on one GPU, or on ``tensor_parallel_size x pipeline_parallel_size`` GPUs.

:class:`Deployment` holds the nine numbers chapter 2's calculator, its static table and its plot
share (the catalog model, the context and batch, the KV and weight dtypes, one GPU's memory and
overhead in GiB, the tensor- and pipeline-parallel sizes), checked once when it is made: a value
that cannot be raises a one-line :class:`~kvlib.KVLibError` naming the field, the value and what
is allowed. :func:`kvlib.sizing.widget.capacity_report` does its arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.checks import as_float, shown
from kvlib.sizing.capacity import MAX_GIB, weight_bytes
from kvlib.sizing.catalog import CatalogEntry, catalog_entry
from kvlib.sizing.parallel import check_parallel
from kvlib.sizing.spec import cache_bytes
from kvlib.units import GiB


def gpu_memory_bytes(gpu_gib: float, overhead_gib: float) -> tuple[int, int]:
    """(GPU bytes, overhead bytes) from GiB, ``int(x * GiB)``; a one-line KVLibError for what cannot be.

    Both must be finite real numbers (not bools, not strings), the GPU positive and at least
    one byte (below it the GPU's share would divide by zero), the overhead non-negative, both at most
    :data:`~kvlib.sizing.capacity.MAX_GIB`.
    """
    numbers = [as_float(v) if isinstance(v, (int, float)) else None for v in (gpu_gib, overhead_gib)]
    if None in numbers or not all(math.isfinite(v) for v in numbers):
        raise KVLibError(
            "GPU memory and overhead must be finite numbers of GiB, "
            f"not {shown(gpu_gib)} and {shown(overhead_gib)}"
        )
    if not gpu_gib > 0 or overhead_gib < 0:
        raise KVLibError(
            f"GPU memory must be positive and overhead non-negative, not {gpu_gib} and {overhead_gib} GiB"
        )
    if max(gpu_gib, overhead_gib) > MAX_GIB:
        raise KVLibError(
            f"GPU memory and overhead must be at most {MAX_GIB:,} GiB, not {gpu_gib!r} and {overhead_gib!r}"
        )
    gpu = int(gpu_gib * GiB)
    if gpu < 1:
        raise KVLibError(f"GPU memory must be at least one byte, not {gpu_gib!r} GiB")
    return gpu, int(overhead_gib * GiB)


@dataclass(frozen=True)
class Deployment:
    """A catalog model at ``context`` tokens x ``batch`` sequences on GPUs of ``gpu_gib`` GiB each.

    ``overhead_gib`` (activations, CUDA context, fragmentation) is per GPU, like ``gpu_gib``; the
    weights (``weight_dtype``) are split evenly over the ``tensor_parallel_size x
    pipeline_parallel_size`` GPUs and the cache as vLLM splits it. Checked in this order (the
    online calculator's script refuses in the same words): the memory, the model, the weight
    dtype, the context, batch and KV dtype (the context at most the model's maximum), then the
    parallel layout vLLM would accept.
    """

    model: str
    context: int
    batch: int = 1
    kv_dtype: str = "fp16"
    gpu_gib: float = 80.0
    weight_dtype: str = "bf16"
    overhead_gib: float = 4.0
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    def __post_init__(self) -> None:
        gpu_memory_bytes(self.gpu_gib, self.overhead_gib)
        if not isinstance(self.model, str):
            raise KVLibError(f"model must be a catalog name, not {self.model!r}")
        entry = catalog_entry(self.model)
        weight_bytes(entry.num_parameters, self.weight_dtype)
        cache_bytes(entry.spec, self.context, self.batch, self.kv_dtype)
        check_parallel(entry.spec, self.tensor_parallel_size, self.pipeline_parallel_size)

    @property
    def entry(self) -> CatalogEntry:
        """The catalog entry of :attr:`model` (its spec and parameter count)."""
        return catalog_entry(self.model)

    @property
    def num_gpus(self) -> int:
        """``tensor_parallel_size x pipeline_parallel_size``."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpu_bytes(self) -> int:
        """One GPU's memory in bytes, ``int(gpu_gib x GiB)``."""
        return gpu_memory_bytes(self.gpu_gib, self.overhead_gib)[0]

    @property
    def overhead_bytes(self) -> int:
        """One GPU's overhead in bytes, ``int(overhead_gib x GiB)``."""
        return gpu_memory_bytes(self.gpu_gib, self.overhead_gib)[1]
