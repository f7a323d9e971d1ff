"""The vLLM map (chapter 8, "Serving as engines do it now"): every kvlib serving knob beside the vLLM
flag that does the same, and what the flag does in vLLM.

Each kvlib place is written as ``"module.function(argument)"`` or ``"module.Class.field"``, so that
:func:`resolve_place` can find it by import and :mod:`inspect` (the tests resolve every row: the
table cannot name a knob that is gone). The imports happen only when a place is resolved, so this
module imports nothing above it. vLLM's behaviour is described from its engine arguments
(``vllm/engine/arg_utils.py``) and its scheduler and KV cache manager, V0 (up to v0.10) and V1;
where the two differ, the row says so. Defaults change between versions; those given are stated
for the version named.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from dataclasses import dataclass

from kvlib import KVLibError


@dataclass(frozen=True)
class FlagRow:
    """One vLLM flag and the kvlib places that play its part."""

    flag: str  # the `vllm serve` flag ("(none)" where vLLM has no flag for a kvlib knob)
    kvlib: tuple[str, ...]  # kvlib places: "module.function(argument)" or "module.Class.field"
    in_vllm: str  # what the flag does in vLLM
    in_kvlib: str  # what the knob does in kvlib, where it differs


_SIM, _ENGINE, _SCHED = (
    "kvlib.serving.simulator.simulate",
    "kvlib.serving.engine.run_engine",
    "kvlib.serving.scheduler",
)

VLLM_FLAG_ROWS = (
    FlagRow(
        "--block-size",
        (f"{_SIM}(block_size)", f"{_ENGINE}(block_size)", "kvlib.serving.roofline.kv_budget(block_size)"),
        "Token slots per KV block (default 16). Larger blocks waste more of each request's last "
        "block and cache prefixes more coarsely; smaller ones make longer block tables.",
        "The same unit (chapter 3); prefix caching shares whole blocks only.",
    ),
    FlagRow(
        "--gpu-memory-utilization",
        (
            "kvlib.serving.roofline.kv_budget(memory_fraction)",
            "kvlib.chapters.ch08_serving_engines.disaggregation.gpu_layout(memory_fraction)",
        ),
        "Share of the GPU's memory the engine may take (default 0.9); the KV cache gets what is "
        "left after the weights and a profiling run's activations.",
        "memory x fraction - weights, no activations (chapter 2's vllm_capacity counts them).",
    ),
    FlagRow(
        "--max-num-seqs",
        (f"{_SCHED}.SchedulerConfig.max_num_seqs",),
        "Most sequences in one step's batch (256 in V0; V1 picks a default by hardware and entry point).",
        "The same cap; chapter 4 shows when it, not memory, bounds the batch.",
    ),
    FlagRow(
        "--max-num-batched-tokens",
        (f"{_SCHED}.SchedulerConfig.max_prefill_tokens", f"{_SCHED}.SchedulerConfig.max_num_batched_tokens"),
        "Tokens one step may compute. Without chunked prefill it bounds the prompts admitted per "
        "step; with it, decodes take one token each first and chunks of prompts fill the rest.",
        "max_prefill_tokens without chunking (a cached prefix counts), max_num_batched_tokens with it.",
    ),
    FlagRow(
        "--enable-chunked-prefill",
        (f"{_SCHED}.SchedulerConfig.enable_chunked_prefill",),
        "Split long prompts into chunks scheduled beside decodes (Sarathi-Serve): steadier time per "
        "output token for a later first token. Always on in V1.",
        "Off by default, so that chapter 4's runs are the paper's.",
    ),
    FlagRow(
        "--enable-prefix-caching",
        (f"{_SIM}(enable_prefix_caching)", "kvlib.paged.block_manager.BlockManager(enable_prefix_caching)"),
        "Hash every full block with its prefix; a new request reuses the blocks of its longest "
        "cached prefix; freed cached blocks stay until evicted (LRU). On by default in V1.",
        "The same hashing and eviction order (chapter 3); "
        "kvlib.chapters.ch08_serving_engines.prefix_prediction predicts the gain.",
    ),
    FlagRow(
        "--kv-cache-dtype",
        (
            "kvlib.sizing.vllm_capacity.vllm_capacity(kv_cache_dtype)",
            "kvlib.quant.formats.kv_quant_format(name)",
        ),
        "Storage type of K and V: auto (the model's dtype) or fp8 (e4m3, e5m2), with per-layer "
        "scales: half the bytes per token, twice the tokens in the same memory.",
        "Sizing counts the bytes (chapter 2); chapter 7 measures what each format costs in quality.",
    ),
    FlagRow(
        "--swap-space",
        (f"{_SCHED}.SchedulerConfig.num_host_blocks",),
        "CPU memory per GPU, in GiB (default 4), for the blocks of preempted requests in V0's swap "
        "mode (and for parallel sampling); V1 preempts by recomputation.",
        "Counted in blocks, not GiB: GiB x 2**30 / (block_size x bytes per token).",
    ),
    FlagRow(
        "--preemption-mode",
        (f"{_SCHED}.SchedulerConfig.preemption_mode",),
        "V0 only: recompute (drop the blocks, prefill again later) or swap (copy them to the CPU "
        "and back). V1 refuses the flag and always recomputes.",
        "recompute (default) or swap, into a host pool of num_host_blocks.",
    ),
    FlagRow(
        "--tensor-parallel-size",
        (
            "kvlib.sizing.parallel.per_gpu_bytes(tensor_parallel_size)",
            "kvlib.chapters.ch08_serving_engines.disaggregation.gpu_layout(tensor_parallel_size)",
        ),
        "Split every layer's weights and heads over N GPUs; each caches num_kv_heads / N KV heads "
        "(one replicated head when N exceeds them).",
        "Sizing only: kvlib serves on one device.",
    ),
    FlagRow(
        "--pipeline-parallel-size",
        (
            "kvlib.sizing.parallel.per_gpu_bytes(pipeline_parallel_size)",
            "kvlib.chapters.ch08_serving_engines.disaggregation.gpu_layout(pipeline_parallel_size)",
        ),
        "Split the layers into N consecutive stages, one per GPU (or node); each caches its own layers.",
        "Sizing only, with vLLM's cut of the layers.",
    ),
    FlagRow(
        "--speculative-config",
        (f"{_ENGINE}(num_speculative_tokens)", f"{_ENGINE}(draft)"),
        'JSON, e.g. {"model": DRAFT, "num_speculative_tokens": 5} (earlier: --speculative-model '
        "and --num-speculative-tokens): a draft proposes k tokens, the target checks them in one pass.",
        "A draft TinyLlama and k; rejected tokens' slots are rolled back in the paged cache.",
    ),
    FlagRow(
        "--max-model-len",
        (f"{_SIM}(max_len)", f"{_ENGINE}(max_len)"),
        "Longest request (prompt + output) the engine accepts; vLLM refuses to start if one such "
        "request does not fit in the KV cache.",
        "Also the reservation of the max policy (the paper's baselines).",
    ),
    FlagRow(
        "(none)",
        (f"{_SIM}(policy)",),
        "vLLM always pages its cache.",
        "max, pow2 and oracle reserve contiguous memory per request: the paper's baselines (chapter 4).",
    ),
    FlagRow(
        "(none)",
        (f"{_SIM}(watermark)",),
        "V0's block manager keeps 1 % of the blocks free at admission (watermark=0.01), not a flag.",
        "The same share, a knob here (chapter 4's watermark sweep).",
    ),
)

_PLACE = re.compile(r"^(?P<path>[A-Za-z_][\w.]*)(\((?P<arg>\w+)\))?$")


def resolve_place(place: str):
    """The object a place names: a parameter (``"module.function(argument)"``, the function's or the
    class's constructor's) or a dataclass field (``"module.Class.field"``); a KVLibError naming
    what is missing otherwise."""
    match = _PLACE.match(place) if isinstance(place, str) else None
    if match is None:
        raise KVLibError(
            f"a kvlib place is 'module.function(argument)' or 'module.Class.field', not {place!r}"
        )
    path, arg = match["path"], match["arg"]
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1] if arg is None else parts[cut:]:
            target = getattr(target, name, None)
        if arg is not None:
            if target is not None and arg in inspect.signature(target).parameters:
                return inspect.signature(target).parameters[arg]
            raise KVLibError(f"{path} has no parameter {arg!r}")
        fields = {f.name: f for f in dataclasses.fields(target)} if dataclasses.is_dataclass(target) else {}
        if parts[-1] in fields:
            return fields[parts[-1]]
        raise KVLibError(f"{'.'.join(parts[:-1])} has no field {parts[-1]!r}")
    raise KVLibError(f"no module of {place!r} can be imported")


def vllm_flag_table() -> list[dict]:
    """:data:`VLLM_FLAG_ROWS` as rows for a table (chapter 8)."""
    return [
        {"vLLM flag": r.flag, "kvlib": ", ".join(r.kvlib), "in vLLM": r.in_vllm, "in kvlib": r.in_kvlib}
        for r in VLLM_FLAG_ROWS
    ]


def bench() -> dict:
    """The vLLM map's count for ``python -m kvlib bench``: flags mapped, and kvlib places that resolve."""
    places = [p for row in VLLM_FLAG_ROWS for p in row.kvlib]
    resolved = 0
    for place in places:
        try:
            resolve_place(place)
            resolved += 1
        except KVLibError:
            pass
    return {
        "vllm_flags_mapped": sum(r.flag != "(none)" for r in VLLM_FLAG_ROWS),
        "vllm_places_resolved": resolved,
    }
