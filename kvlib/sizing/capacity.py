"""Capacity planning on one GPU: what fits beside the weights (chapter 2), and ``python -m kvlib size``.

A server's memory holds the weights, some fixed overhead (activations, the CUDA context),
and the KV cache in what is left. :func:`weight_bytes` counts the weights in a storage
format of :mod:`kvlib.sizing.dtypes`, :func:`free_bytes` what they leave, and
:func:`max_batch` and :func:`max_context` the most sequences, or the longest context, whose
caches (:func:`kvlib.sizing.spec.cache_bytes`) fit there. :func:`capacity_table` sets these
side by side for each KV dtype (chapter 2's capacity table). :func:`size_summary` and
:func:`format_summary` are what ``python -m kvlib size`` reports, as JSON and as a short table;
:func:`format_bytes_gib` writes a byte count as the CLI and the online calculator show it.
"""

from __future__ import annotations

from pathlib import Path

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.sizing.catalog import resolve_model
from kvlib.sizing.dtypes import KVDtype, kv_dtype
from kvlib.sizing.layer_groups import require_count
from kvlib.sizing.parallel import kv_heads_per_gpu, per_gpu_bytes
from kvlib.sizing.spec import ModelSpec, cache_bytes, cache_size, require_spec
from kvlib.units import GiB, ceil_div

# The largest memory, in GiB, that the CLI, the widget and the calculators accept (one PiB): beyond
# it a float times GiB loses integer precision.
MAX_GIB = 1 << 20
# The most parameters weight_bytes counts: a million times the largest published model (~2 x 10**12).
MAX_PARAMETERS = 10**18


def weight_bytes(num_parameters: int, dtype: str | KVDtype = "bf16") -> int:
    """Bytes of the weights: parameters x bytes per parameter (integer formats include their scales)."""
    require_int(num_parameters, "num_parameters", low=1)
    if num_parameters > MAX_PARAMETERS:
        raise KVLibError(f"num_parameters must be at most {MAX_PARAMETERS:,}, not {num_parameters}"[:200])
    dtype = kv_dtype(dtype)
    if not dtype.group_size:
        return num_parameters * dtype.bits // 8
    groups = ceil_div(num_parameters, dtype.group_size)
    return ceil_div(num_parameters * dtype.bits, 8) + groups * dtype.meta_bytes


def kv_budget_bytes(gpu_bytes: int, non_kv_bytes: int, memory_fraction: float = 1.0) -> int:
    """The one KV budget: the GPU's memory x the share an engine may use, minus all that is not KV cache
    (weights, activations, fixed states); negative when those alone do not fit.

    Every "how much KV fits beside the weights" of the book is this line: :func:`free_bytes`
    (chapter 2), vLLM's capacity (:func:`kvlib.sizing.vllm_capacity.vllm_capacity`, chapter 2),
    chapter 4's A100 budget (:func:`kvlib.serving.roofline.kv_budget`) and chapter 5's levers.
    A share of exactly 1 stays in integers (a float would round sizes beyond 2**53 bytes).
    """
    if memory_fraction == 1:
        return gpu_bytes - non_kv_bytes
    return int(gpu_bytes * memory_fraction - non_kv_bytes)  # a float product, as vLLM computes it


def free_bytes(gpu_bytes: int, weights: int, overhead_bytes: int = 0) -> int:
    """Memory left for the KV cache (negative when the weights alone do not fit)."""
    for key, value in (
        ("gpu_bytes", gpu_bytes),
        ("weight_bytes", weights),
        ("overhead_bytes", overhead_bytes),
    ):
        require_int(value, key, low=0)
    return kv_budget_bytes(gpu_bytes, weights + overhead_bytes)


def max_batch(
    spec: ModelSpec,
    context: int,
    gpu_bytes: int,
    weights: int,
    overhead_bytes: int = 0,
    dtype: str | KVDtype = "fp16",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
) -> int:
    """The most sequences of ``context`` tokens whose caches fit beside the weights (0 if none).

    Under tensor/pipeline parallelism ``gpu_bytes``, ``weights`` and ``overhead_bytes`` are one
    GPU's, and the cache is the fullest GPU's share (:func:`kvlib.sizing.parallel.per_gpu_bytes`).
    """
    require_spec(spec)
    free = free_bytes(gpu_bytes, weights, overhead_bytes)
    layout = tensor_parallel_size, pipeline_parallel_size
    return max(0, free // per_gpu_bytes(spec, context, 1, dtype, *layout))


def max_context(
    spec: ModelSpec,
    batch: int,
    gpu_bytes: int,
    weights: int,
    overhead_bytes: int = 0,
    dtype: str | KVDtype = "fp16",
    limit: int | None = None,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
) -> int:
    """The longest context (up to the model's maximum, or ``limit``) at which ``batch`` caches fit.

    0 if not even one token per sequence fits. Under tensor/pipeline parallelism the memory is
    one GPU's and the cache the fullest GPU's share, as in :func:`max_batch`.
    """
    require_spec(spec)
    require_count(batch, "batch", low=1)
    if limit is not None:
        require_count(limit, "limit", low=1)
    free = free_bytes(gpu_bytes, weights, overhead_bytes)
    high = spec.max_context if limit is None else limit
    if high is None:
        raise KVLibError(f"{spec.name} has no maximum context; pass limit=")

    def size(context: int) -> int:
        return per_gpu_bytes(spec, context, batch, dtype, tensor_parallel_size, pipeline_parallel_size)

    if free < size(1):
        return 0
    low = 1  # cache size never shrinks with the context, so bisect for the last one that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if size(mid) <= free else (low, mid - 1)
    return low


def capacity_table(
    spec: ModelSpec,
    num_parameters: int,
    gpu_bytes: int,
    context: int,
    batch: int = 1,
    weight_dtype: str = "bf16",
    overhead_bytes: int = 0,
    kv_dtypes=("fp16", "fp8", "int8", "int4"),
) -> list[dict]:
    """Per KV dtype: cache of ``batch`` x ``context``, its share of the GPU, max batch and max context.

    The max context stops at the model's own maximum (``spec.max_context``); the last column
    says whether that or memory set it (chapter 2's capacity table).
    """
    require_spec(spec)
    require_int(gpu_bytes, "gpu_bytes", low=1)
    if isinstance(kv_dtypes, str) or not isinstance(kv_dtypes, (list, tuple)):
        raise KVLibError(f"kv_dtypes must be a list of KV dtype names, not {kv_dtypes!r:.60}")
    weights = weight_bytes(num_parameters, weight_dtype)
    rows = []
    for name in kv_dtypes:
        size = cache_bytes(spec, context, batch, name)
        longest = max_context(spec, batch, gpu_bytes, weights, overhead_bytes, name)
        capped = spec.max_context is not None and longest == spec.max_context
        rows.append(
            {
                "kv dtype": name,
                "cache (GiB)": round(size / GiB, 3),
                "GPU share": round((weights + overhead_bytes + size) / gpu_bytes, 3),
                "fits": weights + overhead_bytes + size <= gpu_bytes,
                f"max batch at {context:,}": max_batch(
                    spec, context, gpu_bytes, weights, overhead_bytes, name
                ),
                f"max context at batch {batch}": longest,
                "max context limited by": "model's maximum"
                if capped
                else "memory"
                if longest
                else "does not fit",
            }
        )
    return rows


def size_summary(
    model: str | Path | ModelSpec,
    context: int,
    batch: int = 1,
    dtype: str = "fp16",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    encoder_tokens: int | None = None,
    image_tokens: int | None = None,
) -> dict:
    """What ``python -m kvlib size`` reports, as one JSON-able object.

    A context beyond the model's maximum is computed (people size RoPE-scaled contexts) and
    flagged ``exceeds_max_context``; ``per_gpu_bytes`` and ``kv_heads_per_gpu`` are one GPU's
    share under tensor and pipeline parallelism (:mod:`kvlib.sizing.parallel`).
    ``encoder_tokens`` / ``image_tokens``: the cross-attention lengths of an encoder-decoder or
    Llama-3.2-Vision model, when the reader's defaults do not apply (``--encoder-tokens``,
    ``--image-tokens``).
    """
    if isinstance(model, ModelSpec) and (encoder_tokens is not None or image_tokens is not None):
        raise KVLibError(
            "encoder_tokens and image_tokens apply to a model read from its config, not a ModelSpec"
        )
    spec = model if isinstance(model, ModelSpec) else resolve_model(model, encoder_tokens, image_tokens)
    size = cache_size(spec, context, batch, dtype, allow_beyond_max=True)
    per_gpu = per_gpu_bytes(
        spec, context, batch, dtype, tensor_parallel_size, pipeline_parallel_size, allow_beyond_max=True
    )
    vectors, length = spec.cached_vectors
    counts = spec.layer_groups.counts()
    image_layers = [(kind, n) for kind, n in counts.items() if kind.caches and kind.fixed_tokens is not None]
    return {
        "model": spec.name,
        "kind": spec.attention_kind,
        "context": context,
        "batch": batch,
        "kv_dtype": kv_dtype(dtype).name,
        "kv_dtype_format": kv_dtype(dtype).describe(),
        "num_layers": spec.num_layers,
        "num_attention_layers": spec.num_attention_layers,
        "num_kv_heads": spec.num_kv_heads if not spec.is_mla else 1,
        "head_dim": length,
        "vectors_per_token_per_layer": vectors,
        "sliding_window_layers": sum(n for kind, n in counts.items() if kind.caches and kind.window),
        "cross_attention_tokens": spec.cross_attention_tokens,
        # Llama-3.2-Vision: layers that cache a fixed number of image tokens, and that number
        "image_cross_attention_layers": sum(n for kind, n in image_layers),
        "image_tokens": max((kind.fixed_tokens for kind, _ in image_layers), default=0),
        "bytes_per_token": size.bytes_per_token,
        "self_attention_bytes": size.self_attention_bytes,
        "cross_attention_bytes": size.cross_attention_bytes,
        "total_bytes": size.total_bytes,
        "max_context": spec.max_context,
        "exceeds_max_context": size.exceeds_max_context,
        "tensor_parallel_size": tensor_parallel_size,
        "pipeline_parallel_size": pipeline_parallel_size,
        "kv_heads_per_gpu": kv_heads_per_gpu(spec, tensor_parallel_size),
        "per_gpu_bytes": per_gpu,
    }


def format_summary(summary: dict) -> str:
    """The short human-readable table of ``python -m kvlib size``."""
    s = summary
    heads = "one latent vector (MLA)" if s["kind"] == "MLA" else f"{s['num_kv_heads']} KV heads (K and V)"
    lines = [
        ("model", f"{s['model']} ({s['kind']})"),
        (
            "layers",
            f"{s['num_attention_layers']} with a KV cache of {s['num_layers']}"
            + (f", {s['sliding_window_layers']} with a sliding window" if s["sliding_window_layers"] else ""),
        ),
        ("per layer", f"{heads} x {s['head_dim']} values per token"),
        ("kv dtype", s["kv_dtype_format"]),
        ("per token", f"{s['bytes_per_token']:,} B ({s['bytes_per_token'] / 1024:,.1f} KiB)"),
        ("context", f"{s['context']:,} tokens x batch {s['batch']}"),
    ]
    if s["cross_attention_bytes"]:
        lines.append(("self-attn", format_bytes_gib(s["self_attention_bytes"])))
        what = []  # what the cross-attention caches: encoder positions, image tokens, or both
        if s["cross_attention_tokens"]:
            what.append(f"{s['cross_attention_tokens']:,} encoder positions")
        if s.get("image_tokens"):
            what.append(
                f"{s['image_tokens']:,} image tokens in {s['image_cross_attention_layers']:,} "
                "cross-attention layers"
            )
        lines.append(("cross-attn", format_bytes_gib(s["cross_attention_bytes"]) + f" ({'; '.join(what)})"))
    lines.append(("total", format_bytes_gib(s["total_bytes"])))
    if s.get("tensor_parallel_size", 1) * s.get("pipeline_parallel_size", 1) > 1:
        lines.append(
            (
                "per GPU",
                format_bytes_gib(s["per_gpu_bytes"])
                + f" (TP {s['tensor_parallel_size']} x PP {s['pipeline_parallel_size']}:"
                f" {s['kv_heads_per_gpu']} KV heads per GPU, the largest stage)",
            )
        )
    return "\n".join(f"{key:<11}{value}" for key, value in lines)


def format_bytes_gib(n: int) -> str:
    """``n`` bytes exactly and in GiB, "17,179,869,184 B (16.000 GiB)", as the CLI and calculators show it."""
    return f"{n:,} B ({n / GiB:,.3f} GiB)"
