"""Tests of kvlib.quant.fp8: e4m3 with a per-token fp16 scale, relative error <= 2**-4."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.quant.fp8 import quantize_fp8


def _assert_fp8_bound(x, q):
    """|x - back| <= 2**-4 |x| for normals; <= 2**-10 * scale below fp8's normals (half a subnormal step)."""
    back = q.dequantize().float()
    n = x.shape[-1]
    scale = q.scale.float().repeat_interleave(q.group_size, dim=-1)[..., :n]
    bound = torch.maximum(2**-4 * x.float().abs(), 2**-10 * scale) * (1 + 1e-6)
    if x.dtype != torch.float32:  # the result rounded back to x's dtype
        bound = bound + torch.finfo(x.dtype).eps / 2 * back.abs()
    assert bool(((x.float() - back).abs() <= bound).all())


def test_e4m3_exists_on_this_torch():
    assert torch.finfo(torch.float8_e4m3fn).max == 448  # 1.75 * 2**8
    assert torch.tensor([1.0625]).to(torch.float8_e4m3fn).float().item() in (1.0, 1.125)  # 3 mantissa bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group_size", [None, 16, 50])
def test_relative_error_at_most_two_to_minus_four(dtype, group_size):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(5, 2, 128, generator=g) * torch.logspace(-3, 3, 128)).to(dtype)  # wide dynamic range
    q = quantize_fp8(x, group_size)
    assert q.data.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float16
    assert q.scale.shape == (5, 2, -(-128 // (group_size or 128)))
    assert q.dequantize().dtype == dtype
    _assert_fp8_bound(x, q)


def test_the_largest_value_of_a_group_never_overflows_448():
    x = torch.tensor([[1000.0, -3.0, 0.5], [-65504.0, 1.0, 2.0]])
    q = quantize_fp8(x)
    assert bool((q.data.float().abs() <= 448).all()) and bool(torch.isfinite(q.dequantize()).all())
    _assert_fp8_bound(x, q)


def test_zero_and_constant_vectors():
    zeros = torch.zeros(3, 64)
    assert torch.equal(quantize_fp8(zeros).dequantize(), zeros)
    const = torch.full((64,), -2.5)
    _assert_fp8_bound(const, quantize_fp8(const))


def test_bytes_per_vector_one_per_value_plus_two_per_scale():
    q = quantize_fp8(torch.randn(10, 128))  # one scale per vector: 128 + 2 bytes
    assert q.num_bytes == 10 * (128 + 2)
    assert quantize_fp8(torch.randn(10, 128), 32).num_bytes == 10 * (128 + 4 * 2)


@pytest.mark.parametrize(
    ("x", "group_size", "message"),
    [
        (torch.randn(4, 8), 0, "group_size must be a positive integer"),
        (torch.arange(8), None, "float32, float16 or bfloat16"),
        (torch.tensor([float("nan")]), None, "not finite"),
        (torch.zeros(3, 0), None, "non-empty last dim"),
    ],
)
def test_bad_input_gets_one_line_errors(x, group_size, message):
    with pytest.raises(KVLibError, match=message) as info:
        quantize_fp8(x, group_size)
    assert "\n" not in str(info.value)
