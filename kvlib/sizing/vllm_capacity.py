"""How many KV blocks, cached tokens and concurrent requests vLLM gets on one GPU (chapter 2).

kvlib's own capacity functions (:mod:`kvlib.sizing.capacity`) divide free memory by the cache
of a sequence. vLLM's engine counts the same memory in its own units, and a reader who runs
``vllm serve`` reads three of its log lines: ``Available KV cache memory: X GiB``, ``GPU KV cache
size: N tokens`` and ``Maximum concurrency for L tokens per request: C x``. :func:`vllm_capacity`
reproduces them from the numbers vLLM works with, and :func:`vllm_log_lines` prints them as vLLM
does. The rules followed, with the vLLM files they come from (vLLM main at commit 001cabc1 for
``vllm/v1/core/kv_cache_utils.py`` and ``vllm/v1/kv_cache_interface.py``; ``vllm/v1/worker/gpu_worker.py``
at commit 35d5cda1):

- **Available memory** (``Worker.determine_available_memory``): ``int(total_gpu_memory x
  gpu_memory_utilization - non_kv_cache_memory)``, where the non-KV memory is the weights, the
  peak activations of the profiling run (a forward pass of ``max_num_batched_tokens``) and what
  grew outside PyTorch meanwhile (NCCL, CUDA context). CUDA graphs are captured *after* the cache
  is allocated, so at these versions they are not subtracted and come out of the
  ``1 - gpu_memory_utilization`` margin; ``cuda_graph_bytes`` subtracts them for the versions
  that estimate them first (default 0).
- **Page** (``AttentionSpec.page_size_bytes``): one block of one layer on one GPU,
  ``block_size x kv_heads_per_gpu x 2 x head_dim x bytes per value``; an MLA layer stores one
  latent, ``block_size x (kv_lora_rank + qk_rope_head_dim) x bytes per value``, on every rank.
- **Groups** (``get_kv_cache_groups``): a model whose attention layers are all alike forms one
  group; a model mixing full and sliding-window layers is split into groups of equal size, one
  block table each (``_get_kv_cache_groups_uniform_page_size``).
- **Blocks** (``get_num_blocks``): ``available // page // layers per group`` on each GPU; under
  pipeline parallelism every stage then keeps the smallest count (``get_kv_cache_configs``).
- **Log lines** (``_report_kv_cache_config``, ``get_max_concurrency_for_kv_cache_config``): the
  cache holds ``num_blocks // num_groups x block_size`` tokens; a request of ``max_model_len``
  tokens needs ``cdiv(max_model_len, block_size)`` blocks per full-attention group (a sliding
  group: its window plus one batch of tokens, plus one block), and the concurrency is
  ``num_blocks / blocks per request``.
- **Refusals** (``_check_enough_kv_cache_memory``): no memory left, or not enough for one request
  of ``max_model_len`` tokens (vLLM then estimates the longest length that fits).

:data:`VLLM_FLAGS` maps each input to its ``vllm serve`` flag; the CLI is in
:mod:`kvlib.cli.capacity`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.sizing.capacity import MAX_GIB, kv_budget_bytes
from kvlib.sizing.dtypes import KV_DTYPES
from kvlib.sizing.layer_groups import require_count
from kvlib.sizing.parallel import check_parallel, kv_heads_per_gpu, pp_layer_ranges
from kvlib.sizing.spec import ModelSpec, require_spec
from kvlib.units import GiB, ceil_div

VLLM_SOURCE = (
    "vLLM main: vllm/v1/core/kv_cache_utils.py and vllm/v1/kv_cache_interface.py at commit 001cabc1, "
    "vllm/v1/worker/gpu_worker.py (determine_available_memory) at commit 35d5cda1"
)

# Each input of vllm_capacity and the `vllm serve` flag (or log line) it corresponds to.
VLLM_FLAGS = {
    "gpu_memory_bytes": "the GPU's total memory (what torch.cuda.mem_get_info() reports, not the data sheet)",
    "gpu_memory_utilization": "--gpu-memory-utilization (default 0.9)",
    "weight_bytes": "the log line 'Model loading took X GiB' (weights on one GPU)",
    "peak_activation_bytes": "torch_peak_increase of the profiling run (vLLM logs it at debug level)",
    "non_torch_bytes": "non_torch_increase of the profiling run (NCCL buffers, CUDA context growth)",
    "cuda_graph_bytes": "CUDA graph memory, for versions that subtract an estimate before allocating",
    "block_size": "--block-size (default 16; MLA backends such as FlashMLA need 64)",
    "max_model_len": "--max-model-len (default: the model's maximum context)",
    "kv_cache_dtype": "--kv-cache-dtype (auto, fp8, fp8_e4m3, fp8_e5m2)",
    "model_dtype": "--dtype (the cache's dtype when --kv-cache-dtype is auto)",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "max_num_batched_tokens": "--max-num-batched-tokens (matters only for sliding-window layers)",
}

# vLLM's --kv-cache-dtype choices kvlib models, and the bytes of one stored value.
VLLM_KV_CACHE_DTYPES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

# --dtype choices: the cache's bytes per value when --kv-cache-dtype is auto.
VLLM_MODEL_DTYPES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class VLLMCapacity:
    """The KV cache vLLM would allocate on each GPU of one model replica, and what it would log."""

    model: str  # the ModelSpec's name
    tensor_parallel_size: int  # GPUs each layer is split over
    pipeline_parallel_size: int  # stages the layers are split into
    is_mla: bool  # one latent per token and layer, replicated on every rank, instead of K and V per head
    kv_heads_per_gpu: int  # KV heads one rank stores per layer (1 for MLA's latent)
    num_layers_largest_stage: int  # attention layers of the stage with the most
    block_size: int  # tokens per block
    max_model_len: int  # tokens per request the concurrency is given for
    bytes_per_value: int  # of the stored K, V (or latent) values
    requested_bytes: int  # gpu_memory_bytes x gpu_memory_utilization (vLLM's requested memory)
    non_kv_cache_bytes: int  # weights + peak activations + non-torch (+ CUDA graphs)
    available_bytes: int  # "Available KV cache memory" of one GPU
    block_bytes: int  # one block on one GPU: its page in every layer that shares it (largest stage)
    num_kv_cache_groups: int  # block tables (1 unless full and sliding layers are mixed)
    num_layers_per_group: int  # layers sharing one page of a block, on the largest stage
    num_blocks: int  # blocks of every group, the same on every GPU
    num_tokens: int  # "GPU KV cache size: N tokens"
    blocks_per_request: int  # blocks one request of max_model_len tokens takes, over all groups
    max_concurrency: float  # "Maximum concurrency for L tokens per request: C x"
    exceeds_max_context: (
        bool  # max_model_len beyond the model's maximum (vLLM wants VLLM_ALLOW_LONG_MAX_MODEL_LEN)
    )

    @property
    def available_gib(self) -> float:
        """:attr:`available_bytes` in GiB, as vLLM logs it."""
        return self.available_bytes / GiB


def bytes_per_value(kv_cache_dtype: str = "auto", model_dtype: str = "bfloat16") -> int:
    """Bytes of one cached value for vLLM's ``--kv-cache-dtype`` (``auto``: the model's ``--dtype``).

    kvlib's own names fp16, bf16 and fp32 are accepted as the dtype the cache is stored in; int8
    and int4 with group scales are kvlib's formats, not vLLM's, and are refused.
    """
    if not isinstance(kv_cache_dtype, str) or not isinstance(model_dtype, str):
        raise KVLibError(
            f"kv_cache_dtype and model_dtype must be names, not {kv_cache_dtype!r}, {model_dtype!r}"
        )
    if kv_cache_dtype == "auto":
        if model_dtype not in VLLM_MODEL_DTYPES:
            raise KVLibError(f"unknown --dtype {model_dtype!r}; choose from {', '.join(VLLM_MODEL_DTYPES)}")
        return VLLM_MODEL_DTYPES[model_dtype]
    if kv_cache_dtype in VLLM_KV_CACHE_DTYPES:
        return VLLM_KV_CACHE_DTYPES[kv_cache_dtype]
    if kv_cache_dtype in ("fp16", "bf16", "fp32"):
        return KV_DTYPES[kv_cache_dtype].bits // 8
    raise KVLibError(
        f"vLLM has no --kv-cache-dtype {kv_cache_dtype!r} that kvlib models; choose from auto, "
        f"{', '.join(VLLM_KV_CACHE_DTYPES)} (or kvlib's fp16, bf16, fp32)"
    )


def layer_page_bytes(spec: ModelSpec, num_kv_heads: int, block_size: int, value_bytes: int, tp: int) -> int:
    """One block of one attention layer on one GPU (vLLM's ``AttentionSpec.page_size_bytes``).

    K and V of the rank's KV heads, ``block_size x heads x 2 x head_dim x bytes``; an MLA layer
    keeps one latent on every rank (``MLAAttentionSpec``), ``block_size x (kv_lora_rank +
    qk_rope_head_dim) x bytes``.
    """
    if spec.is_mla:
        return block_size * (spec.kv_lora_rank + spec.qk_rope_head_dim) * value_bytes
    return block_size * max(1, num_kv_heads // tp) * 2 * spec.head_dim * value_bytes


def _layer_counts(spec: ModelSpec, start: int = 0, stop: int | None = None) -> dict:
    """{kind: layers} of layers ``start`` .. ``stop - 1``, refusing kinds kvlib's vLLM model lacks."""
    counts = spec.layer_groups.counts(start, stop)
    for kind in counts:
        if not kind.caches:
            raise KVLibError(
                f"{spec.name} has layers without a KV cache (Mamba or linear attention): vLLM pads "
                "their state into the same pages, which kvlib's vLLM capacity does not model"
            )
        if kind.fixed_tokens is not None or spec.cross_attention_tokens:
            raise KVLibError(
                f"{spec.name} has cross-attention layers: vLLM sizes them from "
                "max_num_encoder_input_tokens, which kvlib's vLLM capacity does not model"
            )
    return counts


def blocks_for_request(
    window: int | None, max_model_len: int, block_size: int, max_num_batched_tokens: int
) -> int:
    """Blocks one group needs for a request of ``max_model_len`` tokens (``max_memory_usage_bytes`` / page).

    Full attention: every token, ``cdiv(max_model_len, block_size)``. A sliding window keeps the
    last ``window - 1`` tokens plus one scheduled batch, and one more block because the window
    need not start at a block boundary (``SlidingWindowSpec``).
    """
    if window is None:
        return ceil_div(max_model_len, block_size)
    tokens = min(window - 1 + max_num_batched_tokens, max_model_len)
    return ceil_div(tokens, block_size) + 1


@dataclass(frozen=True)
class _Layout:
    """How vLLM lays one stage's layers into pages: what get_kv_cache_config_from_groups computes."""

    groups_per_window: dict  # {window or None: KV cache groups of layers with that window}
    stage_block_bytes: list  # per stage: bytes of one block over all groups' layers sharing a page
    stage_group_layers: list  # per stage: layers of the largest group there


def _layout(spec: ModelSpec, page, stages) -> _Layout:
    """vLLM's KV cache groups (``get_kv_cache_groups``) and, per stage, one block's bytes.

    One window for every layer (all full attention, or one sliding window): one group whose
    page is the sum of its layers' pages (``UniformTypeKVCacheSpecs``; a uniform model is the
    special case ``layers x page``). Several windows: each window's layers are cut into groups
    of ``group_size`` layers (the fewest layers of any window, or the most when no window has
    1.5 times the layers of another), group *i* taking every ``num_groups``-th layer
    (``_get_kv_cache_groups_uniform_page_size``); a stage then shares a page between as many
    layers as its largest group has there. ``page`` maps a kind to its page bytes.
    """
    counts = _layer_counts(spec)
    by_window: dict = {}
    for kind, n in counts.items():
        by_window[kind.window] = by_window.get(kind.window, 0) + n
    if len(by_window) == 1:
        stage_counts = [_layer_counts(spec, a, b) for a, b in stages]
        block = [sum(n * page(kind) for kind, n in c.items()) for c in stage_counts]
        return _Layout({next(iter(by_window)): 1}, block, [sum(c.values()) for c in stage_counts])
    pages = {page(kind) for kind in counts}
    if len(pages) > 1:
        raise KVLibError(
            f"{spec.name} mixes sliding-window and full layers of different KV heads: vLLM then "
            "rescales block sizes per group, which kvlib's vLLM capacity does not model"
        )
    group_size = (
        max(by_window.values())
        if max(by_window.values()) < 1.5 * min(by_window.values())
        else min(by_window.values())
    )
    groups = {w: ceil_div(n, group_size) for w, n in by_window.items()}
    largest = []
    for a, b in stages:
        here = {w: 0 for w in groups}
        for kind, n in _layer_counts(spec, a, b).items():
            here[kind.window] += n
        # The stage's layers of one window are consecutive in that window's order, so its
        # largest group there holds ceil(layers / groups) of them.
        largest.append(max(ceil_div(here[w], groups[w]) for w in groups))
    page_bytes = pages.pop()
    return _Layout(groups, [page_bytes * n for n in largest], largest)


def _require_bytes(value, key: str) -> None:
    require_int(value, key, low=0)
    if value > MAX_GIB * GiB:
        raise KVLibError(f"{key} must be at most {MAX_GIB * GiB:,} ({MAX_GIB:,} GiB), not {value}"[:200])


def _require_fraction(value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise KVLibError(f"gpu_memory_utilization must be a number in (0, 1], not {value!r}")


def _gib(n: int) -> str:
    """vLLM's format_gib: GiB with two decimals."""
    return f"{n / GiB:.2f}"


def _check_enough_memory(available: int, needed_for, max_model_len: int) -> None:
    """vLLM's refusals: no memory left, or not enough for one request of ``max_model_len`` tokens."""
    if available <= 0:
        raise KVLibError(
            f"vLLM would refuse to start: no available memory for the cache blocks ({_gib(available)} GiB "
            "after weights and activations); try increasing `gpu_memory_utilization`"
        )
    needed = needed_for(max_model_len)
    if needed <= available:
        return
    low, high = 0, max_model_len  # needed_for grows with the length: bisect for the longest that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if needed_for(mid) <= available else (low, mid - 1)
    estimate = f" the estimated maximum model length is {low:,};" if low else ""
    raise KVLibError(
        f"vLLM would refuse to start: one request of max_model_len {max_model_len:,} tokens needs "
        f"{_gib(needed)} GiB of KV cache, more than the available {_gib(available)} GiB;{estimate} "
        "try increasing `gpu_memory_utilization` or decreasing `max_model_len`"
    )


def vllm_capacity(
    spec: ModelSpec,
    gpu_memory_bytes: int,
    weight_bytes: int,
    peak_activation_bytes: int,
    *,
    gpu_memory_utilization: float = 0.9,
    non_torch_bytes: int = 0,
    cuda_graph_bytes: int = 0,
    block_size: int = 16,
    max_model_len: int | None = None,
    kv_cache_dtype: str = "auto",
    model_dtype: str = "bfloat16",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    max_num_batched_tokens: int = 8192,
) -> VLLMCapacity:
    """The KV cache vLLM allocates on each GPU, and its log lines' numbers (see the module docstring).

    Byte counts are per GPU: ``weight_bytes`` is the share of one GPU (vLLM's "Model loading took").
    Raises :class:`~kvlib.KVLibError` with vLLM's reason where vLLM would refuse to start.
    """
    require_spec(spec)
    require_int(gpu_memory_bytes, "gpu_memory_bytes", low=1)
    _require_bytes(gpu_memory_bytes, "gpu_memory_bytes")
    for key, value in (
        ("weight_bytes", weight_bytes),
        ("peak_activation_bytes", peak_activation_bytes),
        ("non_torch_bytes", non_torch_bytes),
        ("cuda_graph_bytes", cuda_graph_bytes),
    ):
        _require_bytes(value, key)
    _require_fraction(gpu_memory_utilization)
    require_count(block_size, "block_size", low=1)
    require_count(max_num_batched_tokens, "max_num_batched_tokens", low=1)
    max_model_len = spec.max_context if max_model_len is None else max_model_len
    if max_model_len is None:
        raise KVLibError(f"{spec.name} has no maximum context; pass max_model_len (--max-model-len)")
    require_count(max_model_len, "max_model_len", low=1)
    value_bytes = bytes_per_value(kv_cache_dtype, model_dtype)
    check_parallel(spec, tensor_parallel_size, pipeline_parallel_size)

    requested = gpu_memory_bytes * gpu_memory_utilization  # a float in vLLM too
    non_kv = weight_bytes + peak_activation_bytes + non_torch_bytes + cuda_graph_bytes
    available = kv_budget_bytes(gpu_memory_bytes, non_kv, gpu_memory_utilization)
    stages = pp_layer_ranges(spec.num_layers, pipeline_parallel_size)

    def page(kind) -> int:
        heads = kind.num_kv_heads or spec.num_kv_heads
        return layer_page_bytes(spec, heads, block_size, value_bytes, tensor_parallel_size)

    layout = _layout(spec, page, stages)
    block = max(layout.stage_block_bytes)  # the fullest stage: every stage keeps its block count

    def blocks(length: int) -> int:  # one request's blocks over all groups
        return sum(
            n * blocks_for_request(w, length, block_size, max_num_batched_tokens)
            for w, n in layout.groups_per_window.items()
        )

    _check_enough_memory(available, lambda length: block * blocks(length), max_model_len)
    num_blocks = available // block
    num_groups = sum(layout.groups_per_window.values())
    return VLLMCapacity(
        model=spec.name,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        is_mla=spec.is_mla,
        kv_heads_per_gpu=kv_heads_per_gpu(spec, tensor_parallel_size),
        num_layers_largest_stage=max(b - a for a, b in stages),
        block_size=block_size,
        max_model_len=max_model_len,
        bytes_per_value=value_bytes,
        requested_bytes=int(requested),
        non_kv_cache_bytes=non_kv,
        available_bytes=available,
        block_bytes=block,
        num_kv_cache_groups=num_groups,
        num_layers_per_group=max(layout.stage_group_layers),
        num_blocks=num_blocks,
        num_tokens=num_blocks // num_groups * block_size,
        blocks_per_request=blocks(max_model_len),
        max_concurrency=num_blocks / blocks(max_model_len),
        exceeds_max_context=spec.max_context is not None and max_model_len > spec.max_context,
    )


def vllm_log_lines(capacity: VLLMCapacity) -> list[str]:
    """The three lines ``vllm serve`` logs about the cache, with these numbers (its format strings)."""
    c = capacity
    return [
        f"Available KV cache memory: {c.available_gib:.2f} GiB",
        f"GPU KV cache size: {c.num_tokens:,} tokens",
        f"Maximum concurrency for {c.max_model_len:,} tokens per request: {c.max_concurrency:.2f}x",
    ]
