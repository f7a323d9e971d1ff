"""Tests of kvlib.model.encdec, the encoder-decoder of chapter 1: which cache grows."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import kv_bytes_per_token
from kvlib.cache.generation import generate_encdec
from kvlib.model.config import ModelConfig
from kvlib.model.encdec import EncoderDecoder
from tests.single_thread import one_torch_thread  # noqa: F401

CONFIG = ModelConfig(
    vocab_size=53, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48, max_seq_len=64
)


@pytest.fixture(scope="module")
def model():
    return EncoderDecoder(CONFIG).eval()


def test_cache_does_not_change_the_tokens(model):
    source = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(0))
    cached, uncached = generate_encdec(model, source, 15), generate_encdec(model, source, 15, use_cache=False)
    assert torch.equal(cached.tokens, uncached.tokens)
    assert cached.cross_kv_projections == CONFIG.num_layers
    assert uncached.cross_kv_projections == CONFIG.num_layers * 15


def test_self_cache_grows_by_one_token_per_step_and_cross_cache_is_fixed(model):
    source = torch.zeros(2, 11, dtype=torch.long)
    run = generate_encdec(model, source, 10)
    per_token = 2 * kv_bytes_per_token(CONFIG)  # batch of 2
    assert run.self_cache_bytes == [per_token * (step + 1) for step in range(10)]
    assert run.cross_cache_bytes == [per_token * 11] * 10


def test_encoder_sees_every_position(model):
    source = torch.randint(0, 53, (1, 8), generator=torch.Generator().manual_seed(1))
    changed = source.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 53
    with torch.inference_mode():
        a, b = model.encode(source), model.encode(changed)
    assert not torch.allclose(a[0, 0], b[0, 0])  # the first position sees the last (no causal mask)


def test_bad_input_is_named(model):
    with pytest.raises(KVLibError, match="source must be"):
        generate_encdec(model, torch.zeros(5, dtype=torch.long), 3)
    with pytest.raises(KVLibError, match="num_new"):
        generate_encdec(model, torch.zeros(1, 3, dtype=torch.long), 64)
