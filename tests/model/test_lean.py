"""Tests of kvlib.model.lean: the lean model with the fast cache chooses the readable model's tokens
(greedy, several prompts, MHA, GQA and MQA); the lean forward pass computes the reference's logits
(to float32 rounding), its fused weights equal the separate projections and follow the parameters."""

import pytest
import torch

from kvlib.cache.contiguous import ConcatKVCache, ContiguousKVCache
from kvlib.cache.fast_contiguous import FastContiguousKVCache
from kvlib.cache.generation import Decoder
from kvlib.chapters.ch01_no_cache.nocache_race import CPU_CONFIG
from kvlib.model.config import ModelConfig
from kvlib.model.lean import FusedWeights, LeanLlama, fuse_layer, normed
from kvlib.model.llama import TinyLlama
from tests.single_thread import one_torch_thread  # noqa: F401

# Float32: the same arithmetic grouped differently (fused products, addmm/addcmul rounding once,
# the norm's scale folded into the weights) moves logits by ~1e-6; 1e-5 is a wide margin that a
# real mistake (a wrong head split or rotation) exceeds by orders of magnitude.
ATOL = 1e-5

SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, d_ff=96, max_seq_len=128)


def _model(num_kv_heads: int = 2, **changes) -> LeanLlama:
    return LeanLlama(ModelConfig(**{**SMALL, "num_kv_heads": num_kv_heads, **changes})).eval()


def _tokens(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, 97, (batch, seq), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "config",
    [CPU_CONFIG, ModelConfig(**SMALL, num_kv_heads=4), ModelConfig(**SMALL, num_kv_heads=1)],
    ids=["GQA (chapter 1's)", "MHA", "MQA"],
)
def test_the_fast_path_chooses_the_readable_path_s_tokens(config):
    """Greedy generation of three prompts at once: the readable model on the readable cache, and the
    lean model (drawn from the same seed) on the fast cache, which it chooses itself."""
    readable, lean = TinyLlama(config).eval(), LeanLlama(config).eval()
    prompts = torch.randint(0, config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(5))
    slow, fast = Decoder(readable, prompts, 40), Decoder(lean, prompts, 40)
    assert type(slow.cache) is ContiguousKVCache and type(fast.cache) is FastContiguousKVCache
    logits = [(slow.step(), fast.step()) for _ in range(40)]
    assert torch.equal(slow.tokens, fast.tokens)  # [exact]: the same tokens, every prompt
    assert max((a - b).abs().max().item() for a, b in logits) < ATOL  # logits to float32 rounding
    assert len(set(slow.tokens[:, 4:].flatten().tolist())) > 3  # not one token repeated


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_lean_logits_equal_the_reference_without_a_cache(num_kv_heads):
    model, tokens = _model(num_kv_heads), _tokens(3, 17)
    with torch.inference_mode():
        lean, reference = model(tokens), model.reference_forward(tokens)
        assert lean.shape == reference.shape == (3, 17, 97)
        assert (lean - reference).abs().max() < ATOL
        last = model(tokens, last_only=True)
    assert last.shape == (3, 1, 97) and (last[:, 0] - reference[:, -1]).abs().max() < ATOL


@pytest.mark.parametrize("cache_type", [FastContiguousKVCache, ContiguousKVCache, ConcatKVCache])
@pytest.mark.parametrize("num_kv_heads", [4, 1], ids=["MHA", "MQA"])
def test_lean_prefill_and_decode_equal_the_reference(num_kv_heads, cache_type):
    model, tokens = _model(num_kv_heads), _tokens(2, 12)

    def run(forward):
        cache = (
            ConcatKVCache(model.config) if cache_type is ConcatKVCache else cache_type(model.config, 2, 12)
        )
        out = [forward(tokens[:, :5], cache)]  # a prefill of 5 tokens, then one token at a time
        out += [forward(tokens[:, t : t + 1], cache) for t in range(5, 12)]
        return torch.cat(out, dim=1)  # (batch, 12, vocab)

    with torch.inference_mode():
        lean, reference = run(model.forward), run(model.reference_forward)
    assert (lean - reference).abs().max() < ATOL


def test_chapter_one_model_chooses_the_same_100_tokens_both_ways():
    model = LeanLlama(CPU_CONFIG).eval()
    prompt = torch.tensor([[0]])
    lean = Decoder(model, prompt, 100)
    lean_logits = [lean.step() for _ in range(100)]
    reference = Decoder(TinyLlama.sharing(model), prompt, 100)  # the same weights, through the modules
    reference_logits = [reference.step() for _ in range(100)]
    assert torch.equal(lean.tokens, reference.tokens)
    assert max((a - b).abs().max().item() for a, b in zip(lean_logits, reference_logits, strict=True)) < ATOL


def test_fused_projections_equal_the_separate_ones():
    model, x = _model(2), torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    block = model.layers[0]
    with torch.no_grad():
        fused = fuse_layer(block)
        buf = model.fused.get(model).buffers(5, 1)  # normed writes into buf.h: five rows
        offset = torch.tensor((64 * model.config.norm_eps) ** 0.5)
        h = block.input_layernorm(x)
        separate = torch.cat(
            [block.self_attn.q_proj(h), block.self_attn.k_proj(h), block.self_attn.v_proj(h)], -1
        )
        assert torch.allclose(normed(x, offset, buf) @ fused.qkv, separate, atol=1e-5)
        h = block.post_attention_layernorm(x)
        separate = torch.cat([block.mlp.gate_proj(h), block.mlp.up_proj(h)], -1)
        assert torch.allclose(normed(x, offset, buf) @ fused.gate_up, separate, atol=1e-5)
    assert fused.qkv.shape == (64, (4 + 2 * 2) * 16) and fused.gate_up.shape == (64, 2 * 96)
    # o and down are the weights transposed into the (n_in, n_out) rows row_product streams
    assert fused.o.is_contiguous() and torch.equal(fused.o, block.self_attn.o_proj.weight.t())
    assert fused.down.is_contiguous() and torch.equal(fused.down, block.mlp.down_proj.weight.t())


def test_fused_weights_follow_the_parameters():
    model, tokens = _model(2), _tokens(1, 6)
    with torch.inference_mode():
        model(tokens)
        model(tokens)
    assert model.fused.num_builds == 1  # built once, then reused
    with torch.no_grad():
        model.layers[1].self_attn.k_proj.weight.mul_(1.5)  # in place: the version counter moves
        model.layers[0].mlp.up_proj.weight = torch.nn.Parameter(model.layers[0].mlp.up_proj.weight * 2)
    with torch.inference_mode():
        lean, reference = model(tokens), model.reference_forward(tokens)
    assert model.fused.num_builds == 2 and (lean - reference).abs().max() < ATOL
    model.load_state_dict(_model(2, seed=7).state_dict())
    with torch.inference_mode():
        assert (model(tokens) - model.reference_forward(tokens)).abs().max() < ATOL
    model.fused.clear()
    with torch.inference_mode():
        model(tokens)
    assert model.fused.num_builds == 4


def test_fused_weights_stay_out_of_the_state_dict_and_work_in_every_mode():
    model, tokens = _model(2), _tokens(1, 4)
    keys = set(model.state_dict())
    with torch.inference_mode():
        model(tokens)  # built here, as ordinary tensors
    assert set(model.state_dict()) == keys and isinstance(model.fused, FusedWeights)
    with torch.no_grad():
        assert (model(tokens) - model.reference_forward(tokens)).abs().max() < ATOL


def test_sharing_runs_the_same_weights_either_way():
    lean, tokens = _model(2), _tokens(2, 7)
    readable = TinyLlama.sharing(lean)
    assert type(readable) is TinyLlama and readable.lm_head is lean.lm_head and not readable.training
    again = LeanLlama.sharing(readable)
    assert again.fused is not lean.fused and again.embed_tokens.weight is lean.embed_tokens.weight
    with torch.inference_mode():
        assert torch.equal(readable(tokens), lean.reference_forward(tokens))
        assert (again(tokens) - readable(tokens)).abs().max() < ATOL


def test_with_gradients_the_forward_pass_is_the_reference_and_trains():
    model, tokens = _model(2), _tokens(1, 4)
    model(tokens).sum().backward()  # grad mode: through the modules, so every weight gets a gradient
    assert all(p.grad is not None for p in model.parameters())
    assert model.fused.num_builds == 0


def test_in_bfloat16_the_lean_model_runs_its_modules():
    model, tokens = _model(2).to(torch.bfloat16), _tokens(2, 9)
    with torch.inference_mode():
        assert torch.equal(model(tokens), model.reference_forward(tokens))
    assert model.fused.num_builds == 0


def test_a_decode_step_dispatches_at_most_half_the_reference_operators():
    from kvlib.chapters.ch01_no_cache.step_roofline import count_step_ops

    model = LeanLlama(CPU_CONFIG).eval()
    lean = Decoder(model, torch.tensor([[0]]), 4)
    lean.step()
    num_lean = count_step_ops(lean.step)[0]
    reference = Decoder(TinyLlama.sharing(model), torch.tensor([[0]]), 4)  # and the readable cache
    reference.step()
    assert num_lean <= 0.6 * count_step_ops(reference.step)[0]


def test_a_cast_model_rebuilds_its_fused_weights():
    model, tokens = _model(2), _tokens(1, 6)
    with torch.inference_mode():
        model(tokens)
        model.double()  # float64: through the modules, the lean pass runs on float32 only
        assert torch.equal(model(tokens), model.reference_forward(tokens)) and model.fused.num_builds == 1
        model.float()  # new storage for every parameter: the fused weights are stale
        lean, reference = model(tokens), model.reference_forward(tokens)
    assert model.fused.num_builds == 2 and model.fused.layers[0].qkv.dtype == torch.float32
    assert not torch.equal(lean, reference) and (lean - reference).abs().max() < ATOL  # the lean pass ran


def test_a_decode_loop_reuses_one_set_of_buffers_and_only_where_the_cache_copies():
    """The lean pass writes a shape's activations into one StepBuffers, made on the first pass of that
    shape; a cache that keeps what it is handed (no ``reuses_buffers``) gets fresh tensors."""
    model = _model(2)
    decoder = Decoder(model, _tokens(2, 5), 6)
    decoder.step()  # the prefill, (2, 5)
    decoder.step()  # the first decode step, (2, 1)
    buffers = model.fused.buffers(2, 1)
    pointers = [getattr(buffers, f).data_ptr() for f in ("x", "qkv", "attn", "gate_up")]
    decoder.step()
    assert model.fused.buffers(2, 1) is buffers
    assert [getattr(buffers, f).data_ptr() for f in ("x", "qkv", "attn", "gate_up")] == pointers
    assert set(model.fused._buffers) == {(2, 5), (2, 1)}
    assert FastContiguousKVCache.reuses_buffers
    assert not hasattr(ConcatKVCache, "reuses_buffers") and not hasattr(ContiguousKVCache, "reuses_buffers")


def test_only_float32_passes_with_a_copying_cache_run_lean_and_shapes_kept_are_bounded():
    from kvlib.model.lean import MAX_BUFFER_SHAPES, runs_lean

    model = _model(2)
    with torch.inference_mode():
        for seq in range(1, MAX_BUFFER_SHAPES + 3):
            model(_tokens(1, seq))
        assert len(model.fused._buffers) <= MAX_BUFFER_SHAPES
    assert runs_lean(model, None) and runs_lean(model, FastContiguousKVCache(model.config, 1, 4))
    # caches that keep what they are handed, or do not take out=: through the modules, exactly
    assert not runs_lean(model, ConcatKVCache(model.config))
    assert not runs_lean(model, ContiguousKVCache(model.config, 1, 4))
    with torch.inference_mode():
        tokens, caches = _tokens(2, 5), [ConcatKVCache(model.config) for _ in range(2)]
        assert torch.equal(model(tokens, caches[0]), model.reference_forward(tokens, caches[1]))
    assert not runs_lean(model.double(), None)
