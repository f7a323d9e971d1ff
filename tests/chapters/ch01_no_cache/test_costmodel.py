"""Tests of kvlib.chapters.ch01_no_cache.costmodel: FLOP counts, the step-time fit, the growth exponent, the
trap's share.
"""

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.chapters.ch01_no_cache.costmodel import (
    PARTS,
    FlopTimeModel,
    fit_flop_time,
    flop_ratio,
    forward_flops,
    growth_exponent,
    overhead_for_speedup,
    step_flops,
)
from kvlib.model.config import ModelConfig

TINY = ModelConfig(vocab_size=10, d_model=8, num_layers=3, num_heads=4, num_kv_heads=2, d_ff=12)


def test_forward_flops_by_hand():
    # head_dim 2: q width 8, kv width 4. One layer, 5 new tokens over 7 keys, times 3 layers.
    flops = forward_flops(TINY, num_new=5, num_keys=7)
    assert set(flops) == set(PARTS)
    assert flops["kv_proj"] == 3 * 2 * 5 * 8 * (4 + 4)
    assert flops["qo_proj"] == 3 * 2 * 5 * (8 * 8 + 8 * 8)
    assert flops["attention"] == 3 * 2 * 2 * 4 * 2 * 5 * 7
    assert flops["mlp"] == 3 * 2 * 5 * 3 * 8 * 12
    assert flops["lm_head"] == 2 * 8 * 10
    assert forward_flops(TINY, 5, 7, batch=4)["mlp"] == 4 * flops["mlp"]


def test_steps_with_a_cache_process_one_token():
    uncached, cached = step_flops(TINY, 6, cached=False), step_flops(TINY, 6, cached=True)
    assert uncached[0] == cached[0]  # the first step reads the 1-token prompt either way
    assert cached[3] == sum(forward_flops(TINY, 1, 4).values())
    assert uncached[3] == sum(forward_flops(TINY, 4, 4).values())
    assert np.all(np.diff(uncached) > 0)


def test_flop_ratio_grows_like_half_the_length():
    config = ModelConfig()
    assert 0.4 * 400 < flop_ratio(config, 400) < 0.6 * 400
    assert flop_ratio(config, 800) > 1.9 * flop_ratio(config, 400)


def test_fit_step_time_recovers_known_constants():
    flops = np.concatenate([np.full(50, 1e6), np.linspace(1e6, 1e9, 50)])
    seconds = 2e-3 + flops / 5e10
    model = fit_flop_time(flops, seconds)
    assert model.overhead_s == pytest.approx(2e-3, rel=1e-6)
    assert model.flops_per_s == pytest.approx(5e10, rel=1e-6)
    assert model.speedup(np.array([1e9]), np.array([1e6])) == pytest.approx((2e-3 + 0.02) / (2e-3 + 2e-5))


def test_fit_step_time_rejects_unusable_data():
    with pytest.raises(KVLibError, match="different FLOPs"):
        fit_flop_time(np.ones(5), np.ones(5))
    with pytest.raises(KVLibError, match="do not grow"):
        fit_flop_time(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]))


def test_the_fixed_cost_for_a_speedup_gives_that_speedup_and_no_more():
    none, cached = step_flops(TINY, 40, cached=False).sum(), step_flops(TINY, 40, cached=True).sum()
    worth = overhead_for_speedup(TINY, 40, 3.0)
    assert worth == pytest.approx((none - 3 * cached) / (2 * 40))  # (F_none - s F_cache) / ((s - 1) n)
    rate = 1e10  # any rate: only overhead x rate matters
    model = FlopTimeModel(worth / rate, rate)
    steps = (step_flops(TINY, 40, cached=False), step_flops(TINY, 40, cached=True))
    assert model.speedup(*steps) == pytest.approx(3.0)
    # a larger fixed cost: a smaller speedup
    assert FlopTimeModel(2 * worth / rate, rate).speedup(*steps) < 3.0
    with pytest.raises(KVLibError, match="exceed 1"):
        overhead_for_speedup(TINY, 40, 1.0)
    with pytest.raises(KVLibError, match="does not reach"):
        overhead_for_speedup(TINY, 40, 1e6)


def test_growth_exponent():
    n = np.array([100, 200, 400, 800])
    assert growth_exponent(n, 3e-6 * n**2) == pytest.approx(2.0)
    assert growth_exponent(n, 1e-3 * n) == pytest.approx(1.0)
    with pytest.raises(KVLibError):
        growth_exponent([100], [1.0])


# ---- the concatenation trap at scale


def test_concat_copy_share_by_hand():
    from fractions import Fraction

    from kvlib.chapters.ch01_no_cache.costmodel import concat_copy_share

    assert concat_copy_share(90, 10) == Fraction(20, 100)  # copy reads and writes the 10 cache bytes
    assert concat_copy_share(0, 5) == 2
    with pytest.raises(KVLibError, match="non-negative"):
        concat_copy_share(-1, 5)


def test_concat_copy_tokens_is_the_first_context_past_the_share():
    from fractions import Fraction

    from kvlib.chapters.ch01_no_cache.costmodel import concat_copy_share, concat_copy_tokens

    weights, per_token = 16_060_522_496, 131_072  # Llama-3-8B in bf16, 128 KiB per token
    for batch in (1, 32):
        n = concat_copy_tokens(weights, per_token, batch)
        assert concat_copy_share(weights, n * per_token * batch) >= Fraction(1, 10)
        assert concat_copy_share(weights, (n - 1) * per_token * batch) < Fraction(1, 10)
    assert concat_copy_tokens(weights, per_token) == 6450
    with pytest.raises(KVLibError, match="share"):
        concat_copy_tokens(weights, per_token, share=2)


def test_concat_copy_table_uses_the_catalog():
    from kvlib.chapters.ch01_no_cache.costmodel import DENSE_FULL_ATTENTION, concat_copy_table

    rows = {row["model"]: row for row in concat_copy_table(batches=(1, 32), context=2048)}
    assert list(rows) == list(DENSE_FULL_ATTENTION)
    llama2 = rows["Llama-2-7B"]  # MHA: 32 x 32 x 128 x 2 x 2 bytes per token
    assert llama2["KV bytes/token"] == 524_288
    assert llama2["copy >= 10% from (tokens), batch 1"] == -(-2 * 6_738_415_616 // (19 * 524_288))
    # 32 sequences need 32x fewer tokens (up to rounding up)
    assert llama2["copy >= 10% from (tokens), batch 32"] == -(-2 * 6_738_415_616 // (19 * 524_288 * 32))
    assert llama2["copy share at 2,048 tokens, batch 1"] == round(
        2 * 2048 * 524_288 / (2 * 6_738_415_616 + 2048 * 524_288), 3
    )


@pytest.mark.parametrize(
    "name, problem",
    [
        ("Mixtral-8x7B", "mixture of experts"),
        ("Mistral-7B-v0.1", "full context"),
        ("Jamba-v0.1", "mixture of experts"),
        ("DeepSeek-V3", "mixture of experts"),
    ],
)
def test_concat_copy_table_refuses_models_it_cannot_count(name, problem):
    from kvlib.chapters.ch01_no_cache.costmodel import concat_copy_table

    with pytest.raises(KVLibError, match=problem):
        concat_copy_table(models=(name,))
