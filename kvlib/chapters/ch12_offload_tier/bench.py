"""The bench section of chapter 12 (``python -m kvlib bench --only offload``): the offload tier's tokens
and measured TTFT on this CPU, its TTFT priced for a GPU over each link, and swapping priced per block
and per layer (a few seconds on one core)."""

from __future__ import annotations

from kvlib.chapters.ch12_offload_tier.copy_calls import measure_copy_calls
from kvlib.chapters.ch12_offload_tier.pricing import (
    HOST_LINKS,
    per_block_break_even_block_size,
    swap_break_even,
    tie_bandwidth,
    tier_ttft,
)
from kvlib.chapters.ch12_offload_tier.returning import (
    STORES,
    cpu_model,
    measure_ttft,
    returning_conversation,
    returning_tokens_identical,
)

LINK_KEYS = {"PCIe 4.0 x16": "pcie4", "PCIe 5.0 x16": "pcie5", "NVLink-C2C": "nvlink_c2c"}


def bench() -> dict:
    """Numeric fields of this chapter's bench."""
    model = cpu_model()
    runs = [returning_conversation(model, kind) for kind in STORES]
    ttft = measure_ttft(model)
    recompute = ttft["none"].median_s
    per_layer, per_block = swap_break_even(16, False), swap_break_even(16, True)
    calls = measure_copy_calls(model, runs[1].allocation.num_loaded_tokens // 16)
    return {
        "offload_tokens_identical": returning_tokens_identical(runs, model),
        "offload_loaded_tokens": runs[1].allocation.num_loaded_tokens,
        "offload_ttft_recompute_s": round(recompute, 5),
        "offload_ttft_cpu_tier_s": round(ttft["cpu"].median_s, 5),
        "offload_ttft_disk_tier_s": round(ttft["cpu+disk"].median_s, 5),
        "offload_ttft_ratio": round(ttft["cpu"].median_s / recompute, 4),
        "offload_ttft_ratio_disk": round(ttft["cpu+disk"].median_s / recompute, 4),
        **{
            f"offload_priced_ttft_ratio_{LINK_KEYS[link]}": round(tier_ttft(link).ratio, 4)
            for link in HOST_LINKS
        },
        "offload_priced_ttft_ratio_nvme": round(tier_ttft("PCIe 5.0 x16", from_disk=True).ratio, 4),
        "offload_tie_bandwidth_gb_s": round(tie_bandwidth() / 1e9, 2),
        "swap_per_layer_break_even_tokens_b16": round(per_layer.crossing_tokens, 1),
        "swap_per_block_slope_over_recompute_b16": round(
            per_block.swap_per_token_s / per_block.recompute_per_token_s, 3
        ),
        "swap_per_block_break_even_block_size": round(per_block_break_even_block_size(), 1),
        "copy_per_block_over_per_layer_cpu": round(calls.per_block.median_s / calls.per_layer.median_s, 2),
        "copy_call_us_cpu": round(1e6 * calls.per_call_s, 2),
    }
