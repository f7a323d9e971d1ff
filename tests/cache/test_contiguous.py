"""Tests of kvlib.cache.contiguous and fast_contiguous: the preallocated caches write in place and
allocate no cache memory per step; the fast one's decode paths (the numba kernel where it runs, else
SDPA, into a given buffer) equal grouped attention and the readable cache to float32 rounding."""

import pytest
import torch

from kvlib.cache.contiguous import ConcatKVCache, ContiguousKVCache
from kvlib.cache.fast_contiguous import FastContiguousKVCache
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig

CONFIG = ModelConfig(vocab_size=61, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=96)


def _kv(generator, batch, num_new):
    shape = (batch, CONFIG.num_kv_heads, num_new, CONFIG.head_dim)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


@pytest.mark.parametrize("preallocated", [ContiguousKVCache, FastContiguousKVCache])
def test_steps_write_into_the_reservation_in_place(preallocated):
    g = torch.Generator().manual_seed(0)
    cache = preallocated(CONFIG, batch_size=2, max_len=10)
    k_ptr, v_ptr = cache.k.data_ptr(), cache.v.data_ptr()
    written = []
    for num_new in (3, 1, 1):
        positions = cache.prepare(num_new)
        assert positions.shape == (2, num_new) and positions.untyped_storage().data_ptr() == (
            cache.positions.untyped_storage().data_ptr()
        )  # a view of the one arange
        k, v = _kv(g, 2, num_new)
        q = torch.randn(2, CONFIG.num_heads, num_new, CONFIG.head_dim, generator=g)
        for layer in range(CONFIG.num_layers):
            cache.attend(layer, q, k, v)
        written.append(k)
    assert (cache.k.data_ptr(), cache.v.data_ptr()) == (k_ptr, v_ptr)
    assert torch.equal(cache.k[1, :, :, :5], torch.cat(written, dim=2))
    assert torch.equal(cache.k[:, :, :, 5:], torch.zeros_like(cache.k[:, :, :, 5:]))


def test_one_token_decode_equals_grouped_attention_and_the_other_caches():
    g = torch.Generator().manual_seed(1)
    lean, concat = FastContiguousKVCache(CONFIG, batch_size=3, max_len=40), ConcatKVCache(CONFIG)
    readable = ContiguousKVCache(CONFIG, batch_size=3, max_len=40)
    for num_new in (7, 1, 1, 1):
        lean.prepare(num_new), concat.prepare(num_new), readable.prepare(num_new)
        k, v = _kv(g, 3, num_new)
        q = torch.randn(3, CONFIG.num_heads, num_new, CONFIG.head_dim, generator=g)
        out = torch.empty_like(q)  # the buffer a decode step of the fast cache may attend into
        a, b, c = lean.attend(0, q, k, v, out=out), concat.attend(0, q, k, v), readable.attend(0, q, k, v)
        # the numba kernel or SDPA sums in another order: float32 rounding (observed ~3e-7), not more
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
        assert torch.equal(b, c)  # the same grouped attention over the same keys
    keys, values = lean.k[0, :, :, : lean.length], lean.v[0, :, :, : lean.length]
    assert torch.allclose(a, grouped_attention(q, keys, values, q_start=lean.length - 1), atol=1e-5)
