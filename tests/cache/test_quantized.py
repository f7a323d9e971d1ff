"""Tests of kvlib.cache.quantized: the quantized cache against the contiguous one, in the model."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import ContiguousKVCache
from kvlib.cache.quantized import QuantizedKVCache
from kvlib.model.config import ModelConfig

CONFIG = ModelConfig(vocab_size=61, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=96)


def _run(cache, steps, seed=0):
    """Feed both layers the same q, k, v for each step's number of tokens; the outputs, in order."""
    g = torch.Generator().manual_seed(seed)
    outs = []
    for num_new in steps:
        cache.prepare(num_new)
        for layer in range(CONFIG.num_layers):
            kv = (2, CONFIG.num_kv_heads, num_new, CONFIG.head_dim)
            k, v = torch.randn(kv, generator=g), torch.randn(kv, generator=g)
            q = torch.randn(2, CONFIG.num_heads, num_new, CONFIG.head_dim, generator=g)
            outs.append(cache.attend(layer, q, k, v))
    return outs


STEPS = (7, 1, 1, 3, 1)


def test_no_quantization_gives_the_contiguous_caches_outputs():
    ref = _run(ContiguousKVCache(CONFIG, 2, 16), STEPS)
    got = _run(QuantizedKVCache(CONFIG, 2, 16, "none"), STEPS)
    # the same arithmetic, to float32 rounding: the contiguous cache stores K/V token-major (its
    # prefill products read them strided) and decodes with the numba kernel on a CPU, not SDPA
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "atol"), [("int8", 0.03), ("fp8", 0.1), ("int4", 0.4)])
def test_quantized_attention_stays_close(name, atol):
    # int8 error per value < range/510 ~ 0.015 for N(0,1) groups; the attention averages values
    ref = _run(ContiguousKVCache(CONFIG, 2, 16), STEPS)
    got = _run(QuantizedKVCache(CONFIG, 2, 16, name), STEPS)
    worst = max((a - b).abs().max().item() for a, b in zip(ref, got, strict=True))
    assert 0 < worst < atol  # lossy, but close


def test_positions_and_bytes():
    cache = QuantizedKVCache(CONFIG, 2, 16, "kivi4")
    assert cache.prepare(3).tolist() == [[0, 1, 2], [0, 1, 2]]
    cache = QuantizedKVCache(CONFIG, 2, 16, "int4")
    _run(cache, STEPS)  # 13 tokens, head_dim 16: per vector 8 code bytes + one group of 16 * 4 bytes
    assert cache.num_bytes == 13 * 2 * 2 * 2 * 2 * (8 + 4)  # tokens * K,V * layers * batch * kv_heads


def test_bad_use_gets_one_line_errors():
    with pytest.raises(KVLibError, match="unknown KV quantization format"):
        QuantizedKVCache(CONFIG, 2, 16, "int3")
    with pytest.raises(KVLibError, match="must be an integer >= 1"):
        QuantizedKVCache(CONFIG, 0, 16)
    cache = QuantizedKVCache(CONFIG, 2, 4)
    with pytest.raises(KVLibError, match="max_len 4"):
        cache.prepare(5)
    cache.prepare(2)
    with pytest.raises(KVLibError, match="after prepare"):
        cache.attend(0, torch.randn(2, 4, 3, 16), torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16))
