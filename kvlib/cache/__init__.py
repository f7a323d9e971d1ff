"""The contiguous KV cache and what it buys (chapter 1; chapter 2's experiments; reused in 3 and 6).

- ``contiguous``: the preallocated cache and the concatenating one (the trap), with their byte
  counts.
- ``quantized``: a cache that stores K/V in a :mod:`kvlib.quant` format and attends over them
  dequantized (the quality chapter of issue 14, not yet written).
- ``eviction``: which tokens a layer keeps under a budget: a sliding window, StreamingLLM's sinks
  plus a window, H2O's heavy hitters plus a recent window (the same chapter).
- ``evicting``: a cache that applies such a policy after every step and attends over the kept
  tokens.
- ``generation``: greedy generation without a cache, with one and with concatenation (one
  :class:`Decoder` step at a time), and the encoder-decoder's generation.
- ``costmodel``: FLOPs per step, the fitted time per FLOP, the growth exponent, and when the
  concatenation trap matters for real models.
- ``article``: the source article's NumPy experiment, reproduced.
- ``nocache_race``: chapter 1's lockstep race of no cache against a cache.
- ``concat_trap``: chapter 1's measurement of what concatenation copies.
- ``transformers_race``: our generation against ``transformers``' ``generate``.
- ``size_check``: the size formula of :mod:`kvlib.sizing.spec` against the bytes real caches hold
  (chapter 2).
- ``decode_speed``: chapter 2's decode attention for each number of KV heads on the roofline
  (chapter 6 reuses it).
- ``decode_roofline``: chapter 2's fused kernel (:mod:`kvlib.kernels`) against the DRAM and
  matmul probes at the same threads: roofline fractions, the ridge point, split-K.
- ``step_roofline``: one whole decode step of the model against its roofline bound (chapter 1).

The caches implement :class:`kvlib.model.config.KVCache`; the paged cache is in
:mod:`kvlib.paged.paged_cache`, one layer up.
"""

from kvlib.cache.article import (
    ARTICLE_FIGURES,
    ArticleRun,
    ArticleSetup,
    cached_loop_traffic,
    cached_step_traffic,
    cached_steps,
    cached_working_set,
    llc_crossing,
    loop_flops,
    loop_with_cache,
    loop_without_cache,
    reproduce,
    step_profile,
)
from kvlib.cache.concat_trap import TrapPoint, concat_trap, filled_cache, trap_lengths
from kvlib.cache.contiguous import ConcatKVCache, ContiguousKVCache, concat_bytes_copied, kv_bytes_per_token
from kvlib.cache.costmodel import (
    DENSE_FULL_ATTENTION,
    PARTS,
    FlopTimeModel,
    concat_copy_share,
    concat_copy_table,
    concat_copy_tokens,
    fit_flop_time,
    flop_ratio,
    forward_flops,
    growth_exponent,
    step_flops,
)
from kvlib.cache.decode_roofline import (
    IDENTITY_BLOCK_SIZE,
    KernelInputs,
    KernelMeasurement,
    RoofProbes,
    SplitK,
    crossing_group,
    kernel_inputs,
    kernel_sweep,
    ridge_point,
    roof_probes,
    split_k_error,
    split_k_speedup,
    time_kernel,
)
from kvlib.cache.decode_speed import (
    DECODE_MIN_LONGEST,
    GPU_LAUNCHES_PER_STEP,
    IMPLEMENTATIONS,
    DecodeMeasurement,
    DecodeSetup,
    OperationTiming,
    bound_breakdown,
    compare_implementations,
    compute_roof,
    decode_inputs,
    decode_setup,
    kernel_setup,
    longest_context,
    measure_decode,
    probe_bandwidth,
    sweep,
    time_decode,
)
from kvlib.cache.generation import MODES, Decoder, EncDecGeneration, Generation, generate, generate_encdec
from kvlib.cache.nocache_race import (
    CPU_CONFIG,
    GPU_CONFIG,
    GPU_MAX_BATCH,
    GPU_PASS_LAUNCHES,
    NoCacheSetup,
    Race,
    estimated_total_s,
    fastest_nearby,
    gpu_batch,
    nocache_setup,
    race,
    speedup_table,
    time_passes,
)
from kvlib.cache.size_check import (
    CacheCheck,
    kvlib_cache_checks,
    small_deepseek_config,
    small_llama_config,
    storage_bytes,
    transformers_cache_check,
)
from kvlib.cache.step_roofline import StepRoofline, StepWork, count_step_ops, measure_decode_step, step_work
from kvlib.cache.transformers_race import (
    GENERATORS,
    GeneratorRace,
    HFGeneration,
    race_generators,
    time_hf_generate,
)

__all__ = [
    "ARTICLE_FIGURES",
    "ArticleRun",
    "ArticleSetup",
    "CPU_CONFIG",
    "CacheCheck",
    "ConcatKVCache",
    "ContiguousKVCache",
    "DECODE_MIN_LONGEST",
    "DENSE_FULL_ATTENTION",
    "DecodeMeasurement",
    "DecodeSetup",
    "Decoder",
    "EncDecGeneration",
    "FlopTimeModel",
    "GENERATORS",
    "GPU_CONFIG",
    "GPU_LAUNCHES_PER_STEP",
    "GPU_MAX_BATCH",
    "GPU_PASS_LAUNCHES",
    "Generation",
    "GeneratorRace",
    "HFGeneration",
    "IDENTITY_BLOCK_SIZE",
    "IMPLEMENTATIONS",
    "KernelInputs",
    "KernelMeasurement",
    "MODES",
    "NoCacheSetup",
    "OperationTiming",
    "PARTS",
    "Race",
    "RoofProbes",
    "SplitK",
    "StepRoofline",
    "StepWork",
    "TrapPoint",
    "bound_breakdown",
    "cached_loop_traffic",
    "cached_step_traffic",
    "cached_steps",
    "cached_working_set",
    "compare_implementations",
    "compute_roof",
    "concat_bytes_copied",
    "concat_copy_share",
    "concat_copy_table",
    "concat_copy_tokens",
    "concat_trap",
    "count_step_ops",
    "crossing_group",
    "decode_inputs",
    "decode_setup",
    "estimated_total_s",
    "fastest_nearby",
    "filled_cache",
    "fit_flop_time",
    "flop_ratio",
    "forward_flops",
    "generate",
    "generate_encdec",
    "gpu_batch",
    "growth_exponent",
    "kernel_inputs",
    "kernel_setup",
    "kernel_sweep",
    "kv_bytes_per_token",
    "kvlib_cache_checks",
    "llc_crossing",
    "longest_context",
    "loop_flops",
    "loop_with_cache",
    "loop_without_cache",
    "measure_decode",
    "measure_decode_step",
    "nocache_setup",
    "probe_bandwidth",
    "race",
    "race_generators",
    "reproduce",
    "ridge_point",
    "roof_probes",
    "small_deepseek_config",
    "small_llama_config",
    "speedup_table",
    "split_k_error",
    "split_k_speedup",
    "step_flops",
    "step_profile",
    "step_work",
    "storage_bytes",
    "sweep",
    "time_decode",
    "time_hf_generate",
    "time_kernel",
    "time_passes",
    "transformers_cache_check",
    "trap_lengths",
]
