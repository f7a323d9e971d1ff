"""The KV cache of one GPU under tensor and pipeline parallelism, laid out as vLLM does (chapter 2).

With ``--tensor-parallel-size N`` vLLM splits every attention layer's heads across N
ranks, and each rank caches the K/V of its own KV heads only: ``num_kv_heads / N`` of them.
When N exceeds the model's KV heads, each KV head is replicated on ``N / num_kv_heads``
ranks and every rank caches exactly one (vLLM's ``QKVParallelLinear`` in
``vllm/model_executor/layers/linear.py`` and ``ModelConfig.get_num_kv_heads`` in
``vllm/config.py``, v0.6 to v0.10). An MLA model caches one latent per token that all
heads share, so every rank holds the whole latent (``get_num_kv_heads`` returns 1 for
MLA). With ``--pipeline-parallel-size P`` the layers are cut into P consecutive stages as
``get_pp_indices`` in ``vllm/distributed/utils.py`` (same versions) cuts them: each stage
gets ``num_layers // P`` layers, and the remainder goes one layer each to the stages
before the last, from the second-to-last backwards. A GPU holds one stage of one rank, so
its cache is the largest stage's share (:func:`per_gpu_bytes`).

:func:`check_parallel` refuses what vLLM refuses, with vLLM's reason: query heads not
divisible by the TP size (``ModelConfig.verify_with_parallel_config``), KV heads neither
divisible by nor dividing the TP size (``QKVParallelLinear``'s ``divide``), and (kvlib's
own rule, since vLLM would build a stage without layers) more PP stages than layers.
"""

from __future__ import annotations

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.sizing.dtypes import KVDtype
from kvlib.sizing.spec import ModelSpec, check_context, require_spec, stack_bytes

# kvlib sizes at most this many pipeline stages (it compares every stage); real deployments use a few.
MAX_PIPELINE_STAGES = 4096


def check_parallel(spec: ModelSpec, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> None:
    """Raise :class:`~kvlib.KVLibError` with vLLM's reason unless vLLM accepts this TP x PP layout."""
    require_spec(spec)
    require_int(tensor_parallel_size, "tensor_parallel_size", low=1)
    require_int(pipeline_parallel_size, "pipeline_parallel_size", low=1)
    tp = tensor_parallel_size
    if spec.num_heads % tp:
        raise KVLibError(
            f"total number of attention heads ({spec.num_heads}) must be divisible by "
            f"tensor parallel size ({tp})"
        )
    if not spec.is_mla:
        for heads in sorted({kind.num_kv_heads or spec.num_kv_heads for kind in spec.layer_groups.counts()}):
            if heads % tp and tp % heads:
                raise KVLibError(
                    f"the number of KV heads ({heads}) must divide or be divisible by "
                    f"tensor parallel size ({tp})"
                )
    if pipeline_parallel_size > spec.num_layers:
        raise KVLibError(
            f"pipeline_parallel_size ({pipeline_parallel_size:,}) exceeds the {spec.num_layers:,} layers "
            f"of {spec.name}: a stage would hold no layer"
        )
    if pipeline_parallel_size > MAX_PIPELINE_STAGES:
        raise KVLibError(
            f"pipeline_parallel_size ({pipeline_parallel_size:,}) is beyond the "
            f"{MAX_PIPELINE_STAGES:,} stages kvlib compares"
        )


def _heads_per_rank(num_kv_heads: int, tensor_parallel_size: int) -> int:
    """KV heads one TP rank caches: its share, or one replicated head when TP exceeds the heads."""
    return max(1, num_kv_heads // tensor_parallel_size)


def kv_heads_per_gpu(spec: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """KV heads one TP rank caches per attention layer (MLA: 1, the latent, replicated on every rank).

    For models whose KV heads differ per layer (OpenELM) this is the rank's share of the
    largest layer (``spec.num_kv_heads``); :func:`per_gpu_bytes` applies the rule per layer.
    """
    check_parallel(spec, tensor_parallel_size, 1)
    if spec.is_mla:
        return 1
    return _heads_per_rank(spec.num_kv_heads, tensor_parallel_size)


def pp_layer_ranges(num_layers: int, pipeline_parallel_size: int) -> list[tuple[int, int]]:
    """(start, stop) layer indices of each pipeline stage, as vLLM's ``get_pp_indices`` cuts them.

    Example: 61 layers on 4 stages are 15, 15, 16, 15 layers (the remainder of 1 goes to
    the second-to-last stage).
    """
    require_int(num_layers, "num_layers", low=1)
    require_int(pipeline_parallel_size, "pipeline_parallel_size", low=1)
    if pipeline_parallel_size > min(num_layers, MAX_PIPELINE_STAGES):
        raise KVLibError(
            f"pipeline_parallel_size ({pipeline_parallel_size:,}) must be at most the number of layers "
            f"({num_layers:,}) and at most {MAX_PIPELINE_STAGES:,}"
        )
    base, remainder = divmod(num_layers, pipeline_parallel_size)
    sizes = [base] * pipeline_parallel_size
    for i in range(2, remainder + 2):
        sizes[-i] += 1
    ranges, start = [], 0
    for size in sizes:
        ranges.append((start, start + size))
        start += size
    return ranges


def stage_bytes(
    spec: ModelSpec,
    context: int,
    batch: int = 1,
    dtype: str | KVDtype = "fp16",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    allow_beyond_max: bool = False,
) -> list[int]:
    """Per pipeline stage, the KV-cache bytes one of its TP ranks holds (self- plus cross-attention)."""
    check_parallel(spec, tensor_parallel_size, pipeline_parallel_size)
    check_context(spec, context, allow_beyond_max)
    require_int(batch, "batch", low=1)

    def heads(num_kv_heads: int) -> int:
        return _heads_per_rank(num_kv_heads, tensor_parallel_size)

    sizes = []
    for start, stop in pp_layer_ranges(spec.num_layers, pipeline_parallel_size):
        counts = spec.layer_groups.counts(start, stop)
        sizes.append(sum(stack_bytes(spec, counts, context, batch, dtype, heads)))
    return sizes


def per_gpu_bytes(
    spec: ModelSpec,
    context: int,
    batch: int = 1,
    dtype: str | KVDtype = "fp16",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    allow_beyond_max: bool = False,
) -> int:
    """KV-cache bytes on the fullest GPU: the largest pipeline stage's share on one TP rank."""
    return max(
        stage_bytes(
            spec, context, batch, dtype, tensor_parallel_size, pipeline_parallel_size, allow_beyond_max
        )
    )
