"""Tests of kvlib.model.llama: the three generation paths agree for MHA, GQA and MQA; weights are seeded."""

import pytest
import torch

from kvlib.cache.generation import generate
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama

# Float32 on the CPU: the three paths do the same arithmetic in different groupings,
# so their logits agree to rounding error (observed ~1e-6); 1e-4 leaves a wide margin.
ATOL = 1e-4

SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, d_ff=96, max_seq_len=128)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_three_generation_paths_agree(num_kv_heads):
    model = TinyLlama(ModelConfig(**{**SMALL, "num_kv_heads": num_kv_heads}))
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(1))
    runs = {mode: generate(model, prompt, 20, mode) for mode in ("none", "cache", "concat")}
    for mode in ("cache", "concat"):
        assert torch.equal(runs[mode].tokens, runs["none"].tokens), mode
        for step, (a, b) in enumerate(zip(runs[mode].step_logits, runs["none"].step_logits, strict=True)):
            assert torch.allclose(a, b, atol=ATOL), f"{mode} step {step}: max diff {(a - b).abs().max():.2e}"


def test_weights_are_seeded():
    a, b = TinyLlama(ModelConfig(**SMALL)), TinyLlama(ModelConfig(**SMALL))
    c = TinyLlama(ModelConfig(seed=1, **SMALL))
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
