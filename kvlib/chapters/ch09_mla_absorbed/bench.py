"""The bench section of chapter 9 (``python -m kvlib bench --only mla``): the absorbed form gives the
small model's tokens unchanged, what it reads per token for DeepSeek-V3, and its speed on this CPU."""

from __future__ import annotations

from kvlib.chapters.ch09_mla_absorbed.decode_model import (
    decode_forms,
    deepseek_v3_shape,
    dsv3_bytes_per_token,
    gpu_ridge,
)
from kvlib.chapters.ch09_mla_absorbed.measured import step_timings, token_runs


def bench() -> dict:
    """Numeric fields: tokens identical (measured), DeepSeek-V3's fp16 bytes read per cached token over
    all layers in both forms and their intensities against the A100's ridge (modelled), and the
    measured speedup of one absorbed decode step over the expanded one on this CPU."""
    runs, timing = token_runs(), step_timings()
    shape = deepseek_v3_shape()
    absorbed, expanded = decode_forms(shape)
    return {
        "mla_absorbed_tokens_identical": runs["identical"],
        "mla_absorbed_max_logit_gap": runs["max_logit_gap"],
        "mla_absorbed_bytes_per_token": dsv3_bytes_per_token(),
        "mla_expanded_bytes_per_token": expanded.bytes_read * shape.num_layers,
        "mla_absorbed_flops_per_byte": absorbed.intensity,
        "mla_expanded_flops_per_byte": expanded.intensity,
        "mla_a100_ridge_flops_per_byte": gpu_ridge(),
        "mla_absorbed_decode_speedup": timing["speedup"],
        "mla_absorbed_step_us_cpu": 1e6 * timing["absorbed_s"],
        "mla_expanded_step_us_cpu": 1e6 * timing["expanded_s"],
    }
