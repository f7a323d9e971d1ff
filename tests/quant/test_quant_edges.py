"""Edges of the quantizers and packers: the dtype limits read back finite, misfit codes and lengths, and
arguments of the wrong type, each a KVLibError (or a finite number) instead of inf or a raw Python error."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.quant.formats import kv_quant_format
from kvlib.quant.fp8 import quantize_fp8
from kvlib.quant.minmax import quantize_minmax
from kvlib.quant.packing import pack_codes, unpack_codes
from kvlib.quant.store import QuantizedKVStore

FP16 = torch.finfo(torch.float16)
BF16_BELOW_FP16_MAX = 65280.0  # the largest bfloat16 not beyond fp16's range


def limits(dtype: torch.dtype) -> torch.Tensor:
    """A vector of the limits: largest, smallest normal, subnormals, zero, mixed signs (in fp16's range)."""
    top = BF16_BELOW_FP16_MAX if dtype == torch.bfloat16 else FP16.max
    values = [top, -top, FP16.tiny, -FP16.tiny, 2.0**-24, -(2.0**-24), 0.0, 1.0, -1.0, top / 3]
    return torch.tensor(values).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group_size", [1, 2, 5, 10])
def test_minmax_at_the_dtype_limits_reads_back_finite_within_half_a_scale(dtype, bits, group_size):
    x = limits(dtype)
    for vector in (x, x.flip(0), x[:2], x[:2].flip(0), torch.full((4,), x[0].item(), dtype=dtype)):
        q = quantize_minmax(vector[None], bits, group_size)
        back = q.dequantize()
        assert back.dtype == dtype and bool(back.isfinite().all())
        scale = q.scale.float().repeat_interleave(group_size, -1)[..., : vector.shape[-1]]
        rounding = back.float().abs() * torch.finfo(dtype).eps  # the cast back to a 16-bit dtype
        assert bool(((back.float() - vector.float()).abs() <= scale / 2 + rounding + 1e-30).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group_size", [None, 1, 3])
def test_fp8_at_the_dtype_limits_reads_back_finite(dtype, group_size):
    x = limits(dtype)
    for vector in (x, x[:2], torch.full((4,), x[0].item(), dtype=dtype)):
        back = quantize_fp8(vector[None], group_size).dequantize()
        assert back.dtype == dtype and bool(back.isfinite().all())


def test_fp16_max_was_inf_after_dequantize():
    x = torch.tensor([[FP16.max, -FP16.max]], dtype=torch.float16)
    assert bool(quantize_minmax(x, 8, 2).dequantize().isfinite().all())
    assert bool(quantize_fp8(torch.tensor([[FP16.max]], dtype=torch.float16)).dequantize().isfinite().all())


def test_bfloat16_beyond_fp16_is_refused():
    with pytest.raises(KVLibError, match="beyond fp16's range"):
        quantize_minmax(torch.tensor([[65504.0]]).bfloat16(), 4)


@pytest.mark.parametrize("bits", [4.0, "4", True, None])
def test_bits_of_another_type_is_named(bits):
    with pytest.raises(KVLibError, match="bits must be one of"):
        quantize_minmax(torch.zeros(1, 4), bits)
    with pytest.raises(KVLibError, match="bits must be one of"):
        pack_codes(torch.zeros(4, dtype=torch.uint8), bits)


@pytest.mark.parametrize(("bits", "code"), [(2, 4), (4, 16), (2, 255)])
def test_a_code_that_does_not_fit_is_refused(bits, code):
    with pytest.raises(KVLibError, match=f"codes must lie in 0..{2**bits - 1}"):
        pack_codes(torch.tensor([code, 0], dtype=torch.uint8), bits)


@pytest.mark.parametrize("length", [100, 9, 6, -1, 2.0])
def test_unpack_refuses_a_length_the_bytes_do_not_hold(length):
    packed = pack_codes(torch.tensor([1, 2, 3, 0], dtype=torch.uint8), 4)  # 2 bytes: 3 or 4 codes
    with pytest.raises(KVLibError, match="length"):
        unpack_codes(packed, 4, length)


def test_unpack_keeps_every_length_the_bytes_hold():
    packed = pack_codes(torch.tensor([1, 2, 3], dtype=torch.uint8), 4)
    assert unpack_codes(packed, 4, 3).tolist() == [1, 2, 3]
    assert unpack_codes(packed, 4, 4).tolist() == [1, 2, 3, 0]


def test_pack_refuses_what_is_not_a_tensor():
    with pytest.raises(KVLibError, match="uint8 tensor"):
        pack_codes([1, 2], 4)
    with pytest.raises(KVLibError, match="uint8 tensor"):
        unpack_codes(None, 4, 2)


def test_store_append_of_no_tokens_is_named():
    store = QuantizedKVStore(kv_quant_format("int4"))
    with pytest.raises(KVLibError, match="at least one token"):
        store.append(torch.zeros(1, 2, 0, 8), torch.zeros(1, 2, 0, 8))
