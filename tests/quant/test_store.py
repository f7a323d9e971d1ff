"""Tests of kvlib.quant.store: which tokens are quantized when, and the bytes really held."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.quant.formats import kv_quant_format
from kvlib.quant.minmax import quantize_minmax
from kvlib.quant.store import QuantizedKVStore


def _kv(num, seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 3, num, 64, generator=g).to(dtype) for _ in range(2))


def test_kivi_quantizes_a_group_when_the_residual_fills():
    store = QuantizedKVStore(kv_quant_format("kivi4", residual_length=4))
    k, v = _kv(11)
    store.append(k[:, :, :6], v[:, :, :6])  # prefill of 6: one group of 4, 2 left in the residual
    assert (store.num_quantized, store.num_residual, store.quantized_at) == (4, 2, [6])
    for t in range(6, 11):  # tokens 6, 7 fill the residual at 8; 9 .. 11 wait
        store.append(k[:, :, t : t + 1], v[:, :, t : t + 1])
    assert (store.num_quantized, store.num_residual, store.quantized_at) == (8, 3, [6, 8])
    assert torch.equal(store.keys()[:, :, 8:], k[:, :, 8:])  # the residual: exact
    assert torch.equal(store.values()[:, :, 8:], v[:, :, 8:])
    # the quantized keys: per channel, 4 tokens of a channel share a scale and zero point
    qk, qv = store.chunks[1]
    assert qk.scale.shape == (2, 3, 64, 1) and qv.scale.shape == (2, 3, 4, 64 // 32)
    expected = quantize_minmax(k[:, :, 4:8].transpose(2, 3), 4, 4).dequantize().transpose(2, 3)
    assert torch.equal(store.keys()[:, :, 4:8], expected)


def test_kivi_per_channel_keys_follow_an_outlier_channel():
    k, v = _kv(8, seed=1, dtype=torch.float32)
    k[..., 5] += 50.0  # one channel with large values, as in real models' keys
    kivi = QuantizedKVStore(kv_quant_format("kivi4", residual_length=8))
    per_token = QuantizedKVStore(kv_quant_format("int4"))
    kivi.append(k, v)
    per_token.append(k, v)
    others = [c for c in range(64) if c != 5]
    kivi_err = (kivi.keys() - k)[..., others].abs().max()
    token_err = (per_token.keys() - k)[..., others].abs().max()
    assert kivi_err < token_err / 4  # per token, the outlier widens the scale of its group of 32


def test_no_residual_quantizes_everything_at_once():
    store = QuantizedKVStore(kv_quant_format("int8"))
    k, v = _kv(5)
    store.append(k, v)
    assert (store.num_quantized, store.num_residual) == (5, 0)
    assert store.keys().shape == k.shape and store.keys().dtype == torch.float16
    # 2 * 2 * 3 vectors per token * (64 code bytes + 2 groups * 4) bytes
    assert store.num_bytes == 5 * 2 * 2 * 3 * (64 + 8)


@pytest.mark.parametrize("name", ["none", "int8", "int4", "int2", "fp8", "kivi4", "kivi2"])
def test_bytes_held_match_the_format(name):
    fmt = kv_quant_format(name, residual_length=16 if name.startswith("kivi") else None)
    store = QuantizedKVStore(fmt)
    k, v = _kv(40)
    store.append(k[:, :, :21], v[:, :, :21])
    for t in range(21, 40):
        store.append(k[:, :, t : t + 1], v[:, :, t : t + 1])
    assert store.length == 40 and store.keys().shape == k.shape
    assert store.num_bytes == 6 * fmt.context_bytes(40, 64)  # batch 2 * 3 KV heads
    if name == "none":
        assert torch.equal(store.keys(), k) and torch.equal(store.values(), v)


def test_bad_input_gets_one_line_errors():
    store = QuantizedKVStore(kv_quant_format("int4"))
    k, v = _kv(3)
    with pytest.raises(KVLibError, match="must be"):
        store.append(k, v[:, :, :2])
    store.append(k, v)
    with pytest.raises(KVLibError, match="holds torch.float16"):
        store.append(k.float(), v.float())
    with pytest.raises(KVLibError, match="float32, float16 or bfloat16"):
        store.append(k.int(), v.int())
    with pytest.raises(KVLibError, match="KVQuantFormat"):
        QuantizedKVStore("int4")
    with pytest.raises(KVLibError, match="empty"):
        QuantizedKVStore(kv_quant_format("int4")).keys()
