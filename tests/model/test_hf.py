"""Tests of kvlib.model.hf: our TinyLlama against transformers' LlamaForCausalLM (weights, logits)."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.generation import generate
from kvlib.chapters.ch01_no_cache.transformers_race import time_hf_generate
from kvlib.model.config import ModelConfig
from kvlib.model.hf import (
    from_hf,
    hf_config,
    load_hf_weights,
    max_logit_difference,
    model_config_of,
    quiet_transformers,
    random_hf_llama,
    to_hf,
)
from kvlib.model.llama import TinyLlama
from tests.single_thread import one_torch_thread  # noqa: F401

# Float32, same operations in a different order (HF uses torch's fused SDPA): logits agree to
# ~1e-7 (observed 2e-7); 1e-5 leaves a wide margin and would still catch any real difference
# (a wrong rotary convention or norm changes logits by ~1e-2).
ATOL = 1e-5

SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, d_ff=96, max_seq_len=128)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_hf_weights_give_hf_logits(num_kv_heads):
    config = ModelConfig(**SMALL, num_kv_heads=num_kv_heads)
    hf_model = random_hf_llama(config, seed=5)
    model = from_hf(hf_model)
    assert model.config == config
    tokens = torch.randint(0, 97, (2, 50), generator=torch.Generator().manual_seed(0))
    assert max_logit_difference(model, hf_model, tokens) < ATOL


def test_a_real_difference_is_detected():
    config = ModelConfig(**SMALL, num_kv_heads=2)
    hf_model = random_hf_llama(config, seed=5)
    model = from_hf(hf_model)
    with torch.no_grad():
        model.layers[1].self_attn.k_proj.weight.mul_(1.5)
    tokens = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(0))
    assert max_logit_difference(model, hf_model, tokens) > 100 * ATOL


def test_export_to_hf_generates_our_tokens_with_and_without_its_cache():
    model = TinyLlama(ModelConfig(**SMALL, num_kv_heads=2)).eval()
    hf_model = to_hf(model)
    prompt = torch.tensor([[1, 2, 3]])
    ours = generate(model, prompt, 12, "cache").tokens
    for use_cache in (True, False):
        run = time_hf_generate(hf_model, prompt, 12, use_cache=use_cache, repeats=1)
        assert torch.equal(run.tokens, ours), use_cache
        assert run.tokens_per_s(12) > 0


def test_config_round_trip():
    config = ModelConfig(**SMALL, num_kv_heads=1, rope_theta=500000.0, norm_eps=1e-6)
    hf = hf_config(config)
    assert (hf.hidden_size, hf.num_key_value_heads, hf.head_dim) == (64, 1, 16)
    assert model_config_of(random_hf_llama(config)) == config


def test_mismatched_weights_are_named():
    hf_model = random_hf_llama(ModelConfig(**SMALL, num_kv_heads=2))
    with pytest.raises(KVLibError, match="k_proj.weight: Hugging Face shape"):
        load_hf_weights(TinyLlama(ModelConfig(**SMALL, num_kv_heads=4)), hf_model)
    with pytest.raises(KVLibError, match="lack 'layers.2"):
        load_hf_weights(TinyLlama(ModelConfig(**{**SMALL, "num_layers": 3}, num_kv_heads=2)), hf_model)
    with pytest.raises(KVLibError, match="have 'layers.1"):
        load_hf_weights(TinyLlama(ModelConfig(**{**SMALL, "num_layers": 1}, num_kv_heads=2)), hf_model)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("tie_word_embeddings", True, "tie_word_embeddings"),
        ("attention_bias", True, "attention_bias"),
        ("hidden_act", "gelu", "hidden_act"),
    ],
)
def test_unsupported_hf_features_are_named(field, value, message):
    hf_model = random_hf_llama(ModelConfig(**SMALL, num_kv_heads=2))
    setattr(hf_model.config, field, value)
    with pytest.raises(KVLibError, match=message):
        model_config_of(hf_model)


def test_quiet_transformers_restores_the_verbosity():
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    with quiet_transformers():
        assert hf_logging.get_verbosity() == hf_logging.ERROR
    assert hf_logging.get_verbosity() == before
