"""Tests of kvlib.model.head_pooling: a model converted to fewer K/V heads (chapter 7).

Pooled projections give the mean of the group's heads' K and V where that must hold (the
projections, the rotated keys, the first layer's cache); keeping one head reproduces it; the
converted model is a new, complete model that runs, generates and caches g / h of the bytes."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import ContiguousKVCache, kv_bytes_per_token
from kvlib.cache.generation import generate
from kvlib.model.config import ModelConfig
from kvlib.model.head_pooling import pool_kv_heads, pooled_rows
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama
from kvlib.model.rotary import apply_rotary, rotary_cos_sin, rotary_inv_freq
from tests.single_thread import one_torch_thread  # noqa: F401

# Float32: the mean of the rows applied to x and the mean of the rows' products sum the same
# numbers in another order, a few ulps of values of order 1 (~1e-7 each); 1e-5 is a wide margin
# that a wrong grouping (heads paired across groups, a transposed split) exceeds by orders of magnitude.
ATOL = 1e-5

SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, d_ff=96, max_seq_len=64)
HEAD_DIM = 16  # d_model 64 / num_heads 4


def _model(num_kv_heads: int = 4) -> TinyLlama:
    return TinyLlama(ModelConfig(**SMALL, num_kv_heads=num_kv_heads, seed=5)).eval()


def _tokens(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, 97, (batch, seq), generator=torch.Generator().manual_seed(3))


def _x(seq: int = 7) -> torch.Tensor:
    return torch.randn(2, seq, 64, generator=torch.Generator().manual_seed(4))


def _group_mean(heads: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """(batch, h, seq, head_dim) -> (batch, g, seq, head_dim): the mean of each group of h / g heads."""
    batch, h, seq, hd = heads.shape
    return heads.view(batch, num_kv_heads, h // num_kv_heads, seq, hd).mean(dim=2)


def test_pooled_rows_by_hand():
    # head_dim 1: each row is a head. Groups of g = 2 from 4 heads: {0, 1} and {2, 3}.
    weight = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    assert torch.equal(pooled_rows(weight, 2, 1), torch.tensor([[2.0, 3.0], [6.0, 7.0]]))  # (1+3)/2, (2+4)/2
    assert torch.equal(pooled_rows(weight, 1, 1), torch.tensor([[4.0, 5.0]]))  # (1+3+5+7)/4, (2+4+6+8)/4
    assert torch.equal(pooled_rows(weight, 2, 1, "keep", 1), torch.tensor([[3.0, 4.0], [7.0, 8.0]]))
    # head_dim 2: rows 0-1 are head 0, rows 2-3 head 1; one group of both
    assert torch.equal(pooled_rows(weight, 1, 2), torch.tensor([[3.0, 4.0], [5.0, 6.0]]))


@pytest.mark.parametrize(
    ("start", "target"), [(4, 2), (4, 1), (2, 1)], ids=["MHA->GQA", "MHA->MQA", "GQA->MQA"]
)
def test_pooled_projections_are_the_mean_of_the_groups_projections(start, target):
    model = _model(start)
    pooled = pool_kv_heads(model, target)
    assert pooled.config.num_kv_heads == target and pooled.config.seed == model.config.seed
    x = _x()
    with torch.no_grad():
        for old, new in zip(model.layers, pooled.layers, strict=True):
            for proj in ("k_proj", "v_proj"):
                heads = old.self_attn.split_heads(getattr(old.self_attn, proj), x, start)  # (2, h, 7, hd)
                mine = new.self_attn.split_heads(getattr(new.self_attn, proj), x, target)  # (2, g, 7, hd)
                assert mine.shape == (2, target, 7, HEAD_DIM)
                assert (mine - _group_mean(heads, target)).abs().max() < ATOL
            # the query and output projections, norms and MLP are the original's, bit for bit
            for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "input_layernorm"):
                assert torch.equal(new.get_submodule(name).weight, old.get_submodule(name).weight)


def test_pooled_keys_are_the_mean_of_the_rotated_keys_at_later_positions():
    """RoPE rotates every head of a token by the same angles, a linear map: rotate(mean) = mean(rotate)."""
    model = _model(4)
    pooled = pool_kv_heads(model, 2)
    x = _x(5)
    positions = torch.arange(9, 14).expand(2, 5)  # positions 9 .. 13, far from 0 (no rotation)
    cos, sin = rotary_cos_sin(positions, rotary_inv_freq(HEAD_DIM, model.config.rope_theta))
    with torch.no_grad():
        old, new = model.layers[1].self_attn, pooled.layers[1].self_attn
        rotated = apply_rotary(old.split_heads(old.k_proj, x, 4), cos, sin)  # (2, 4, 5, hd)
        mine = apply_rotary(new.split_heads(new.k_proj, x, 2), cos, sin)  # (2, 2, 5, hd)
    assert (mine - _group_mean(rotated, 2)).abs().max() < ATOL
    assert (rotated[:, 0] - rotated[:, 1]).abs().max() > 100 * ATOL  # the heads differ: a mean to take


@pytest.mark.parametrize("target", [2, 1], ids=["GQA", "MQA"])
def test_first_layers_cached_kv_are_the_group_means_after_prefill_and_decode(target):
    """Layer 0 sees the same input in both models, so its cached K (rotated) and V are the group means
    of the original's at every position; later layers' inputs differ (attention is not linear)."""
    model, tokens = _model(4), _tokens(2, 10)
    pooled = pool_kv_heads(model, target)
    caches = {}
    with torch.inference_mode():
        for name, m in (("old", model), ("new", pooled)):
            cache = ContiguousKVCache(m.config, 2, 10)
            m(tokens[:, :6], cache)  # a prefill at positions 0-5, then decode steps at 6-9
            for t in range(6, 10):
                m(tokens[:, t : t + 1], cache)
            caches[name] = cache
    old, new = caches["old"], caches["new"]
    assert new.k.shape == (2, 2, target, 10, HEAD_DIM)  # (layers, batch, kv_heads, max_len, head_dim)
    assert (new.k[0] - _group_mean(old.k[0], target)).abs().max() < ATOL
    assert (new.v[0] - _group_mean(old.v[0], target)).abs().max() < ATOL
    assert (new.k[1] - _group_mean(old.k[1], target)).abs().max() > 100 * ATOL  # where it must not hold


def test_keeping_one_head_reproduces_that_heads_kv():
    model, tokens = _model(4), _tokens(2, 8)
    kept = pool_kv_heads(model, 2, method="keep", kept_head=1)  # groups {0, 1}, {2, 3}: heads 1 and 3
    for old, new in zip(model.layers, kept.layers, strict=True):
        for proj in ("k_proj", "v_proj"):
            rows = getattr(old.self_attn, proj).weight.view(4, HEAD_DIM, 64)[[1, 3]].reshape(32, 64)
            assert torch.equal(getattr(new.self_attn, proj).weight, rows)  # the rows themselves
    caches = []
    with torch.inference_mode():
        for m in (model, kept):
            caches.append(ContiguousKVCache(m.config, 2, 8))
            m(tokens, caches[-1])
    # the same rows and inputs; a BLAS may block a narrower product differently, hence float rounding
    assert (caches[1].k[0] - caches[0].k[0][:, [1, 3]]).abs().max() < ATOL
    assert (caches[1].v[0] - caches[0].v[0][:, [1, 3]]).abs().max() < ATOL
    first = pool_kv_heads(model, 1, method="keep")  # the GQA paper's "first": head 0 of one group
    assert torch.equal(first.layers[0].self_attn.v_proj.weight, model.layers[0].self_attn.v_proj.weight[:16])


@pytest.mark.parametrize("method", ["mean", "keep"])
@pytest.mark.parametrize("heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_the_same_number_of_heads_is_an_exact_copy(heads, method):
    model, tokens = _model(heads), _tokens(2, 9)
    same = pool_kv_heads(model, heads, method=method)
    assert same.config == model.config
    old_state, new_state = model.state_dict(), same.state_dict()
    assert old_state.keys() == new_state.keys()
    assert all(torch.equal(old_state[k], new_state[k]) for k in old_state)
    with torch.inference_mode():
        assert torch.equal(same(tokens), model(tokens))


@pytest.mark.parametrize(("target", "bytes_per_token"), [(4, 1024), (2, 512), (1, 256)])
def test_converted_model_generates_with_a_cache_of_g_over_h_the_bytes(target, bytes_per_token):
    # 2 (K and V) x 2 layers x target heads x head_dim 16 x 4 bytes (float32): 1024, 512, 256
    model, prompt = _model(4), _tokens(2, 5)
    pooled = pool_kv_heads(model, target)
    assert kv_bytes_per_token(model.config) == 2 * 2 * 4 * 16 * 4 == 1024
    assert kv_bytes_per_token(pooled.config) == bytes_per_token
    out = generate(pooled, prompt, 6, mode="cache")
    assert out.tokens.shape == (2, 11) and torch.equal(out.tokens[:, :5], prompt)
    # the whole reservation: 11 tokens x 2 sequences x bytes per token
    assert out.cache.num_bytes == 11 * 2 * bytes_per_token
    assert out.cache.num_bytes * 4 == generate(model, prompt, 6).cache.num_bytes * target
    assert torch.equal(out.tokens, generate(pooled, prompt, 6, mode="none").tokens)  # the cache is right


def test_the_lean_pass_fuses_the_converted_weights_and_follows_them():
    model, tokens = LeanLlama.sharing(_model(4)), _tokens(2, 7)
    with torch.inference_mode():
        before = model(tokens)
    builds = model.fused.num_builds
    pooled = pool_kv_heads(model, 2)
    assert type(pooled) is LeanLlama and pooled.fused is not model.fused and pooled.fused.num_builds == 0
    with torch.inference_mode():
        lean = pooled(tokens)
        assert pooled.fused.layers[0].qkv.shape == (64, (4 + 2 * 2) * HEAD_DIM)  # [q | k | v] of 4 + 2 + 2
        assert (lean - pooled.reference_forward(tokens)).abs().max() < ATOL
        assert torch.equal(model(tokens), before) and model.fused.num_builds == builds  # original untouched
    with torch.no_grad():
        pooled.layers[0].self_attn.k_proj.weight.mul_(2.0)  # in place: the fused weights go stale
    with torch.inference_mode():
        changed = pooled(tokens)
        assert pooled.fused.num_builds == 2
        assert (changed - pooled.reference_forward(tokens)).abs().max() < ATOL
    assert (changed - lean).abs().max() > 100 * ATOL


def test_conversion_draws_nothing_shares_nothing_and_keeps_dtype_grad_and_mode():
    model = _model(4)
    old_state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    pooled = pool_kv_heads(model, 2)
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(torch.equal(old_state[k], v) for k, v in model.state_dict().items())  # original untouched
    old_ptrs = {p.data_ptr() for p in model.parameters()}
    assert not any(p.data_ptr() in old_ptrs for p in pooled.parameters())
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in pooled.parameters())
    assert not pooled.training and type(pooled) is TinyLlama  # of the original's class
    half = LeanLlama.sharing(_model(4)).to(torch.bfloat16).train()
    half.lm_head.weight.requires_grad_(False)
    converted = pool_kv_heads(half, 1)
    assert all(p.dtype == torch.bfloat16 for p in converted.parameters())
    assert not converted.lm_head.weight.requires_grad and converted.embed_tokens.weight.requires_grad
    assert converted.training and type(converted) is LeanLlama


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_kv_heads=3), "must divide the model's 4 K/V heads"),
        (dict(num_kv_heads=0), "positive integer, not 0"),
        (dict(num_kv_heads=-2), "positive integer, not -2"),
        (dict(num_kv_heads=True), "positive integer, not True"),
        (dict(num_kv_heads=2.0), "positive integer, not 2.0"),
        (dict(num_kv_heads="2"), "positive integer, not '2'"),
        (dict(num_kv_heads=8), "exceeds the model's 4 K/V heads"),
        (dict(num_kv_heads=2, method="max"), "method must be one of mean, keep, not 'max'"),
        (dict(num_kv_heads=2, method="keep", kept_head=2), "from 0 to 1"),
        (dict(num_kv_heads=2, method="keep", kept_head=-1), "from 0 to 1"),
        (dict(num_kv_heads=2, method="keep", kept_head=True), "kept_head must be an integer"),
        (dict(num_kv_heads=2, kept_head=1), "applies to method 'keep' only"),
    ],
)
def test_bad_arguments_give_a_one_line_error(kwargs, message):
    with pytest.raises(KVLibError) as caught:
        pool_kv_heads(_model(4), **kwargs)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_only_a_tinyllama_converts():
    with pytest.raises(KVLibError, match="must be a kvlib TinyLlama, not Linear"):
        pool_kv_heads(torch.nn.Linear(2, 2), 1)
