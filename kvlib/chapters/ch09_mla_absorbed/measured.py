"""Chapter 9's measured runs on this CPU: the small MLA model's greedy tokens in both decode forms,
and one decode step of one MLA layer over a long cached context in each form (kvlib.measure.timing)."""

from __future__ import annotations

import torch

from kvlib.checks import require_int
from kvlib.measure.timing import clock_for, time_it, torch_threads
from kvlib.model.mla import MLAAttention, MLACache, MLAConfig, TinyMLA
from kvlib.model.seeding import seeded_weights

SMALL = MLAConfig(num_layers=3)  # the chapter's small model (random seeded weights)
PROMPT_SEED, PROMPT_LEN, NUM_NEW_TOKENS = 7, 16, 24
# one layer of a wider MLA for the timing: the same ratios as DeepSeek-V3 (rank 4x rope, 16 heads)
TIMED = MLAConfig(
    hidden_size=512,
    num_layers=1,
    num_heads=16,
    kv_lora_rank=128,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
)
TIMED_CONTEXT = 1024  # cached tokens the timed step attends to


def token_runs(config: MLAConfig = SMALL) -> dict:
    """Greedy tokens of the seeded prompt in both forms, and the largest logit gap of one decode step."""
    model = TinyMLA(config)
    prompt = torch.randint(
        0, config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(PROMPT_SEED)
    )
    absorbed = model.generate(prompt, NUM_NEW_TOKENS, absorbed=True)
    expanded = model.generate(prompt, NUM_NEW_TOKENS, absorbed=False)
    gaps = []
    caches = model.new_cache(), model.new_cache()
    for chunk in (prompt, prompt[:, :1]):
        a, e = model(chunk, caches[0], True), model(chunk, caches[1], False)
        gaps.append(float((a - e).abs().max()))
    return {
        "absorbed": absorbed,
        "expanded": expanded,
        "identical": absorbed == expanded,
        "max_logit_gap": max(gaps),
        "cache_bytes_per_token": caches[0].num_bytes() // caches[0].seq_len,
    }


def timed_layer(config: MLAConfig = TIMED, context: int = TIMED_CONTEXT):
    """One seeded MLA layer, a cache of ``context`` random latents and one new token's input."""
    require_int(context, "context", low=1)
    with seeded_weights(config.seed):
        layer = MLAAttention(config).eval()
        latent = torch.randn(1, context, config.kv_lora_rank)  # (batch, ctx, rank)
        rope_key = torch.randn(1, context, config.qk_rope_head_dim)  # (batch, ctx, rope_dim)
        x = torch.randn(1, 1, config.hidden_size)  # (batch, 1, hidden)
    return layer, latent, rope_key, x


def step_timings(config: MLAConfig = TIMED, context: int = TIMED_CONTEXT, repeats: int = 7) -> dict:
    """Median seconds of one decode step of one layer in each form (one torch thread, thread clock)."""
    layer, latent, rope_key, x = timed_layer(config, context)

    def step(absorbed: bool):
        cache = MLACache(1)
        cache.latents[0], cache.rope_keys[0] = latent, rope_key
        with torch.no_grad():
            return layer(x, cache, 0, absorbed)

    with torch_threads(1):
        clock = clock_for("cpu", 1)
        absorbed = time_it(lambda: step(True), repeats=repeats, warmup=2, clock=clock)
        expanded = time_it(lambda: step(False), repeats=repeats, warmup=2, clock=clock)
    return {
        "absorbed_s": absorbed.median_s,
        "expanded_s": expanded.median_s,
        "speedup": expanded.median_s / absorbed.median_s,
        "max_gap": float((step(True) - step(False)).abs().max()),
    }
