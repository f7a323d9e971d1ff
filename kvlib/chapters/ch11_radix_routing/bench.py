"""The bench section of chapter 11 (``python -m kvlib bench --only radix``): the tree's tokens on the engine
model (measured), the tree's and the hash cache's hit rates at equal capacity (counted), and routing
across four simulated replicas (simulated on the A100 OPT-13B roofline step model); a few seconds."""

from __future__ import annotations

from kvlib.chapters.ch11_radix_routing.hit_rates import (
    BENCH_SLOTS,
    CACHES,
    engine_conversations,
    make_manager,
    replay,
)
from kvlib.chapters.ch11_radix_routing.routing import NEVER, RouterConfig, one_replica_rows, simulate_routing
from kvlib.chapters.ch11_radix_routing.traces import few_shot_trace, multi_turn_trace
from kvlib.chapters.ch12_offload_tier.returning import cpu_model


def bench() -> dict:
    """Numeric fields of this chapter's bench."""
    model = cpu_model()
    identical = all(engine_conversations(model, size).tokens_identical for size in (16, 1))
    rates = {
        name: {kind: replay(make_manager(kind, BENCH_SLOTS), trace).hit_rate for kind in CACHES}
        for name, trace in (("multi_turn", multi_turn_trace()), ("few_shot", few_shot_trace()))
    }
    hashed, pages16, pages1 = CACHES
    runs = {policy: simulate_routing(policy) for policy in ("round-robin", "least-loaded", "prefix-aware")}
    runs["no balance"] = simulate_routing("prefix-aware", config=RouterConfig(balance_abs_threshold=NEVER))
    rr = runs["round-robin"]
    alone = {row["prefix cache"]: row for row in one_replica_rows()}
    return {
        "radix_tokens_identical": identical,
        "radix_prefix_hit_rate": round(rates["multi_turn"][pages1], 4),
        "radix_pages16_hit_rate": round(rates["multi_turn"][pages16], 4),
        "hash_prefix_hit_rate": round(rates["multi_turn"][hashed], 4),
        "radix_few_shot_hit_rate": round(rates["few_shot"][pages1], 4),
        "hash_few_shot_hit_rate": round(rates["few_shot"][hashed], 4),
        "radix_one_replica_tokens_per_s_ratio": round(
            alone["radix"]["tokens/s"] / alone["none"]["tokens/s"], 3
        ),
        "radix_one_replica_p99_ttft_ratio": round(
            alone["radix"]["p99 TTFT (s)"] / alone["none"]["p99 TTFT (s)"], 3
        ),
        "routing_round_robin_hit_rate": round(rr.hit_rate, 4),
        "routing_cache_aware_hit_ratio": round(runs["prefix-aware"].hit_rate / rr.hit_rate, 3),
        "routing_p99_ttft_ratio": round(runs["prefix-aware"].p99_ttft_s / rr.p99_ttft_s, 3),
        "routing_least_loaded_p99_ttft_ratio": round(runs["least-loaded"].p99_ttft_s / rr.p99_ttft_s, 3),
        "routing_no_balance_p99_ttft_ratio": round(runs["no balance"].p99_ttft_s / rr.p99_ttft_s, 3),
        "routing_cache_aware_tokens_per_s_ratio": round(
            runs["prefix-aware"].tokens_per_s / rr.tokens_per_s, 3
        ),
    }
