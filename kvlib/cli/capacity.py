"""``python -m kvlib capacity``: the KV cache vLLM would allocate, and the lines it would log (chapter 2).

:func:`add_parser` adds the command to the subparsers of ``python -m kvlib``; :func:`run` is its
handler, over :func:`kvlib.sizing.vllm_capacity.vllm_capacity`.
The model is a catalog name or a ``config.json`` path, as for ``size``. Memory is given in GiB per
GPU, as vLLM logs it; the flags that are vLLM's keep vLLM's names. Bad input raises
:class:`~kvlib.KVLibError` (the CLI prints one line and exits 2): a float that is not finite, a
size beyond :data:`MAX_GIB`, a combination vLLM refuses.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict

from kvlib import KVLibError
from kvlib.cli.model_flags import MODEL_HELP, VERBOSE_HELP, check_parallel_flags, report_ignored_keys
from kvlib.sizing.capacity import MAX_GIB, weight_bytes
from kvlib.sizing.catalog import catalog_entry, catalog_names, resolve_model
from kvlib.sizing.vllm_capacity import VLLMCapacity, vllm_capacity, vllm_log_lines
from kvlib.units import GiB, ceil_div


def gib_bytes(value, flag: str) -> int:
    """``value`` GiB in bytes, ``int(value x GiB)``; a KVLibError naming ``flag`` unless finite, in range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise KVLibError(f"{flag} must be a finite number of GiB, not {value!r}")
    if not 0 <= value <= MAX_GIB:
        raise KVLibError(f"{flag} must be between 0 and {MAX_GIB:,} GiB, not {value!r}")
    return int(value * GiB)


def _gpu_bytes(value) -> int:
    """--gpu-memory-gib in bytes: at least one byte."""
    gpu = gib_bytes(value, "--gpu-memory-gib")
    if gpu < 1:
        raise KVLibError(f"--gpu-memory-gib must be at least one byte, not {value!r} GiB")
    return gpu


def _weights(args, spec) -> tuple[int, str]:
    """Weight bytes on one GPU: --weight-gib, or a catalog model's parameters split over tp x pp GPUs."""
    if args.weight_gib is not None:
        return gib_bytes(args.weight_gib, "--weight-gib"), "given"
    if args.model.lower() not in {name.lower() for name in catalog_names()}:
        raise KVLibError(
            "--weight-gib is needed for a config.json (vLLM logs it as 'Model loading took X GiB')"
        )
    total = weight_bytes(catalog_entry(args.model).num_parameters, args.weight_dtype)
    gpus = args.tensor_parallel_size * args.pipeline_parallel_size
    return ceil_div(total, gpus), f"estimated: {args.weight_dtype} parameters / {gpus} GPU(s)"


def run(args) -> int:
    """The handler of ``python -m kvlib capacity`` (argparse namespace in, exit status out)."""
    check_parallel_flags(args)
    spec = resolve_model(args.model)
    weights, weights_source = _weights(args, spec)
    capacity = vllm_capacity(
        spec,
        _gpu_bytes(args.gpu_memory_gib),
        weights,
        gib_bytes(args.activation_gib, "--activation-gib"),
        gpu_memory_utilization=args.gpu_memory_utilization,
        non_torch_bytes=gib_bytes(args.non_torch_gib, "--non-torch-gib"),
        cuda_graph_bytes=gib_bytes(args.cuda_graph_gib, "--cuda-graph-gib"),
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        kv_cache_dtype=args.kv_cache_dtype,
        model_dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    if capacity.exceeds_max_context:
        sys.stderr.write(
            f"kvlib: warning: --max-model-len {capacity.max_model_len:,} exceeds {spec.name}'s maximum of "
            f"{spec.max_context:,} tokens (vLLM needs VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 or rope scaling)\n"
        )
    if args.verbose:
        report_ignored_keys(args.model)
    if args.json:
        print(
            json.dumps({**asdict(capacity), "weights": weights_source, "log_lines": vllm_log_lines(capacity)})
        )
    else:
        print(format_capacity(capacity, weights_source))
    return 0


def format_capacity(c: VLLMCapacity, weights_source: str = "given") -> str:
    """The short table of ``python -m kvlib capacity``: the arithmetic, then vLLM's log lines."""
    gib = lambda n: f"{n / GiB:,.2f} GiB"  # noqa: E731 - a local formatter
    per_gpu = "one MLA latent per layer" if c.is_mla else f"{c.kv_heads_per_gpu} KV head(s) per layer"
    lines = [
        (
            "model",
            f"{c.model}, tensor_parallel_size {c.tensor_parallel_size} x pipeline_parallel_size "
            f"{c.pipeline_parallel_size}",
        ),
        ("per GPU", f"{per_gpu}, {c.num_layers_largest_stage} attention layers on the largest stage"),
        (
            "memory",
            f"{gib(c.requested_bytes)} requested - {gib(c.non_kv_cache_bytes)} not KV "
            f"(weights {weights_source}) = {gib(c.available_bytes)}",
        ),
        (
            "block",
            f"{c.block_bytes:,} B: {c.block_size} tokens in each of the {c.num_layers_per_group} layers "
            "sharing it",
        ),
        (
            "blocks",
            f"{c.num_blocks:,} in {c.num_kv_cache_groups} group(s) of {c.num_layers_per_group} layers",
        ),
        ("request", f"{c.blocks_per_request:,} blocks for {c.max_model_len:,} tokens"),
    ]
    table = [f"{key:<9}{value}" for key, value in lines]
    return "\n".join([*table, "vLLM logs:", *(f"  {line}" for line in vllm_log_lines(c))])


def add_parser(subparsers) -> None:
    """Add ``capacity`` to the subparsers of ``python -m kvlib`` (the parser class is the caller's)."""
    cap = subparsers.add_parser(
        "capacity", help="the KV blocks, cached tokens and concurrency vLLM would get on one GPU"
    )
    cap.add_argument("model", help=MODEL_HELP)
    gib = {"type": float, "metavar": "GIB"}
    cap.add_argument("--gpu-memory-gib", required=True, help="total memory of one GPU", **gib)
    cap.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's flag (default 0.9)")
    cap.add_argument("--weight-gib", help="weights on one GPU (default: catalog estimate)", **gib)
    cap.add_argument(
        "--weight-dtype", default="bf16", choices=("bf16", "fp8", "int4"), help="for the estimate"
    )
    cap.add_argument(
        "--activation-gib", required=True, help="peak activations of vLLM's profiling run", **gib
    )
    cap.add_argument("--non-torch-gib", default=0.0, help="memory outside PyTorch (NCCL ...)", **gib)
    cap.add_argument("--cuda-graph-gib", default=0.0, help="CUDA graphs, if subtracted (default 0)", **gib)
    cap.add_argument("--block-size", type=int, default=16, help="vLLM's flag (default 16)")
    cap.add_argument("--max-model-len", type=int, help="vLLM's flag (default: the model's maximum)")
    cap.add_argument("--kv-cache-dtype", default="auto", help="vLLM's flag: auto, fp8, fp8_e4m3, fp8_e5m2")
    cap.add_argument("--dtype", default="bfloat16", help="vLLM's --dtype, the cache's when auto")
    cap.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM's flag (default 1)")
    cap.add_argument("--pipeline-parallel-size", type=int, default=1, help="vLLM's flag (default 1)")
    cap.add_argument("--max-num-batched-tokens", type=int, default=8192, help="vLLM's flag (default 8192)")
    cap.add_argument("--json", action="store_true", help="print one JSON object")
    cap.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    cap.set_defaults(func=run)


# Each CLI flag and the vllm_capacity input it sets (its vLLM meaning: VLLM_FLAGS).
CLI_INPUTS = {
    "--gpu-memory-gib": "gpu_memory_bytes",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--weight-gib": "weight_bytes",
    "--activation-gib": "peak_activation_bytes",
    "--non-torch-gib": "non_torch_bytes",
    "--cuda-graph-gib": "cuda_graph_bytes",
    "--block-size": "block_size",
    "--max-model-len": "max_model_len",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--dtype": "model_dtype",
    "--tensor-parallel-size": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "--max-num-batched-tokens": "max_num_batched_tokens",
}
