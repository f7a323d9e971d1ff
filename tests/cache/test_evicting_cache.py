"""Tests of kvlib.cache.evicting_cache: H2O's scores by hand, the full cache's outputs, the budget, the
model.
"""

import math

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import ContiguousKVCache
from kvlib.cache.evicting_cache import EvictingKVCache
from kvlib.cache.eviction_policies import H2O, SlidingWindow, StreamingLLM
from kvlib.cache.generation import generate
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama

CONFIG = ModelConfig(vocab_size=61, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=96)
STEPS = (7, 1, 1, 3, 1, 1, 1)  # 15 tokens: a prefill, decode steps, a chunk of 3
POLICIES = (lambda b: SlidingWindow(b), lambda b: StreamingLLM(b, 2), lambda b: H2O(b, 2))


def _qkv(g, num_new, batch=2):
    kv = (batch, CONFIG.num_kv_heads, num_new, CONFIG.head_dim)
    q = torch.randn(batch, CONFIG.num_heads, num_new, CONFIG.head_dim, generator=g)
    return q, torch.randn(kv, generator=g), torch.randn(kv, generator=g)


def _run(cache, steps=STEPS, seed=0, after_step=None):
    """Feed both layers random q, k, v for each step's number of tokens; the outputs, in order."""
    g = torch.Generator().manual_seed(seed)
    outs = []
    for num_new in steps:
        cache.prepare(num_new)
        for layer in range(CONFIG.num_layers):
            outs.append(cache.attend(layer, *_qkv(g, num_new)))
        if after_step is not None:
            after_step(cache)
    return outs


@pytest.mark.parametrize("make", POLICIES)
def test_a_budget_that_holds_everything_gives_the_contiguous_caches_attention(make):
    ref = _run(ContiguousKVCache(CONFIG, 2, 15))
    got = _run(EvictingKVCache(CONFIG, 2, make(15)))
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)  # explicit softmax vs fused: rounding


@pytest.mark.parametrize("make", POLICIES)
def test_no_layer_ever_holds_more_than_the_budget_between_steps(make):
    held = []

    def record(cache):
        held.append([cache.num_held(layer) for layer in range(CONFIG.num_layers)])
        for layer in range(CONFIG.num_layers):
            assert cache.held_positions(layer).shape == (2, cache.num_held(layer))

    cache = EvictingKVCache(CONFIG, 2, make(4))
    _run(cache, after_step=record)
    # lengths after each step 7, 8, 9, 12, 13, 14, 15, all above the budget 4
    assert held == [[4, 4]] * len(STEPS)
    # 4 tokens * K,V * layers * batch * kv_heads * head_dim 16 * 4 bytes
    assert cache.num_bytes == 4 * 2 * 2 * 2 * 2 * 16 * 4
    assert cache.prepare(1).tolist() == [[15], [15]]  # positions go on: evicted tokens still count


@pytest.mark.parametrize(
    ("policy", "visible"),
    [
        (SlidingWindow(3), lambda t: list(range(max(0, t - 3), t + 1))),  # 3 kept + the new token
        # up to 4 tokens all kept, then sinks 0, 1 and the last 2 before t, and t itself
        (StreamingLLM(4, 2), lambda t: (list(range(t)) if t <= 4 else [0, 1, t - 2, t - 1]) + [t]),
    ],
)
def test_decoding_attends_over_exactly_the_kept_tokens_and_the_new_one(policy, visible):
    cache = EvictingKVCache(CONFIG, 2, policy)
    g = torch.Generator().manual_seed(1)
    ks, vs = [], []
    for t in range(12):
        assert cache.prepare(1).tolist() == [[t], [t]]
        q, k, v = _qkv(g, 1)
        ks.append(k)
        vs.append(v)
        out = cache.attend(0, q, k, v)
        seen = visible(t)
        ref = grouped_attention(q, torch.cat([ks[i] for i in seen], 2), torch.cat([vs[i] for i in seen], 2))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        cache.attend(1, q, k, v)


def test_h2o_accumulates_attention_over_heads_and_steps_by_hand():
    # one layer, 2 query heads sharing 1 K/V head of width 2 (scale 1/sqrt(2)), batch 1
    config = ModelConfig(vocab_size=8, d_model=4, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=8)
    cache = EvictingKVCache(config, 1, H2O(2, recent=1))
    s = math.sqrt(2)
    key = {0: [1.0, 0.0], 1: [0.0, 0.0], 2: [0.0, 0.0], 3: [0.0, 0.0]}
    value = {t: [float(t), 10.0 * t] for t in key}

    def kv(*ts):
        return torch.tensor([[[key[t] for t in ts]]]), torch.tensor([[[value[t] for t in ts]]])

    # step 1, positions 0 and 1. Query 0 sees key 0 only: weight 1 in each head. Query 1, head 0,
    # q = (sqrt2 ln3, 0): scores ln3 and 0, weights 3/4 and 1/4; head 1, q = 0: 1/2 and 1/2.
    # key 0: 1 + 1 + 3/4 + 1/2 = 3.25; key 1: 1/4 + 1/2 = 0.75. Two tokens fit the budget of 2.
    cache.prepare(2)
    q = torch.tensor([[[[0.0, 0.0], [s * math.log(3), 0.0]], [[0.0, 0.0], [0.0, 0.0]]]])
    cache.attend(0, q, *kv(0, 1))
    torch.testing.assert_close(cache.layers[0].scores, torch.tensor([[3.25, 0.75]]))
    # step 2, position 2, q = (-sqrt2 ln8, 0) in both heads: exp scores 1/8, 1, 1, weights 1/17,
    # 8/17, 8/17 per head. This step alone favours key 1 (16/17 against 2/17), but the sums are
    # key 0: 3.25 + 2/17, key 1: 0.75 + 16/17 = 1.69: H2O keeps key 0 and the recent key 2.
    cache.prepare(1)
    cache.attend(0, torch.tensor([[[[-s * math.log(8), 0.0]], [[-s * math.log(8), 0.0]]]]), *kv(2))
    assert cache.held_positions(0).tolist() == [[0, 2]]
    torch.testing.assert_close(cache.layers[0].scores, torch.tensor([[3.25 + 2 / 17, 16 / 17]]))
    # step 3, position 3, q = 0: equal weights over keys 0, 2, 3 (key 1 is gone); the output is
    # the mean of their values, ((0 + 2 + 3) / 3, (0 + 20 + 30) / 3), in both heads
    cache.prepare(1)
    out = cache.attend(0, torch.zeros(1, 2, 1, 2), *kv(3))
    torch.testing.assert_close(out, torch.tensor([5 / 3, 50 / 3]).expand(1, 2, 1, 2))


def test_a_prefill_masks_by_position():
    # query i of a 3-token prefill sees keys 0 .. i: with v_i = e_i (head_dim 4) and q = 0, the
    # outputs are the running means (1, 0, 0, 0), (1/2, 1/2, 0, 0), (1/3, 1/3, 1/3, 0) in every head
    config = ModelConfig(vocab_size=8, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=8)
    cache = EvictingKVCache(config, 1, SlidingWindow(8))
    cache.prepare(3)
    out = cache.attend(0, torch.zeros(1, 2, 3, 4), torch.randn(1, 1, 3, 4), torch.eye(3, 4)[None, None])
    means = torch.tensor([[1.0, 0, 0, 0], [1 / 2, 1 / 2, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0]])
    torch.testing.assert_close(out, means.expand(1, 2, 3, 4))


def _greedy(model, prompt, num_new, cache):
    tokens = prompt
    with torch.inference_mode():
        logits = model(prompt, cache, last_only=True)[:, -1]
        for _ in range(num_new):
            nxt = logits.argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
            logits = model(nxt, cache, last_only=True)[:, -1]
    return tokens


@pytest.mark.parametrize("make", POLICIES)
def test_the_model_generates_through_the_cache(make):
    config = ModelConfig(vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=128)
    model = TinyLlama(config).eval()
    prompt = torch.tensor([[5, 17, 3, 88, 41, 9], [60, 2, 2, 71, 13, 30]])
    full = generate(model, prompt, 10).tokens  # the contiguous cache's greedy tokens
    roomy = EvictingKVCache(config, 2, make(16))
    assert torch.equal(_greedy(model, prompt, 10, roomy)[:, :16], full)
    tight = EvictingKVCache(config, 2, make(5))
    tokens = _greedy(model, prompt, 10, tight)
    assert tokens.shape == (2, 16) and torch.equal(tokens[:, :7], full[:, :7])  # the prefill saw it all
    assert [tight.num_held(layer) for layer in range(2)] == [5, 5]


def test_bad_use_gets_one_line_errors():
    with pytest.raises(KVLibError, match="policy must be"):
        EvictingKVCache(CONFIG, 2, "h2o")
    with pytest.raises(KVLibError, match="must be an integer >= 1"):
        EvictingKVCache(CONFIG, 0, SlidingWindow(4))
    cache = EvictingKVCache(CONFIG, 2, SlidingWindow(4), max_len=4)
    with pytest.raises(KVLibError, match="max_len 4"):
        cache.prepare(5)
    with pytest.raises(KVLibError, match="cannot add 0 tokens"):
        cache.prepare(0)
    cache.prepare(2)
    with pytest.raises(KVLibError, match="after prepare"):
        cache.attend(0, *_qkv(torch.Generator().manual_seed(0), 3))
    cache.attend(0, *_qkv(torch.Generator().manual_seed(0), 2))
    with pytest.raises(KVLibError, match="layer 0 has seen 2 tokens; this step starts at 0"):
        cache.attend(0, *_qkv(torch.Generator().manual_seed(0), 2))
