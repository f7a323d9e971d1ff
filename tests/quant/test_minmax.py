"""Tests of kvlib.quant.minmax: the error bound of min-max rounding, edge cases, the stored bytes."""

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.quant.minmax import quantize_minmax


def _assert_within_half_a_scale(x, q):
    """|x - read back| <= scale / 2 per value, plus float32 rounding of code * s + z (a few ulps of |x|)
    and the rounding of the result to x's dtype (half its epsilon, relative: 2**-11 fp16, 2**-8 bf16)."""
    back = q.dequantize().float()
    g = q.group_size
    n = x.shape[-1]
    scale = q.scale.float().repeat_interleave(g, dim=-1)[..., :n]  # each value's group scale
    slack = 1e-6 * (x.float().abs() + q.zero.float().abs().repeat_interleave(g, dim=-1)[..., :n])
    if x.dtype != torch.float32:
        slack = slack + torch.finfo(x.dtype).eps / 2 * back.abs()
    assert bool(((x.float() - back).abs() <= scale / 2 + slack).all())


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group_size", [1, 7, 32, 128])
def test_round_trip_within_half_a_scale(bits, dtype, group_size):
    g = torch.Generator().manual_seed(bits + group_size)
    x = (torch.randn(4, 3, 128, generator=g) * 3 + 1).to(dtype)
    q = quantize_minmax(x, bits, group_size)
    assert q.dequantize().dtype == dtype and q.dequantize().shape == x.shape
    _assert_within_half_a_scale(x, q)
    # not too coarse either: the scale is (max - zero) / (2**bits - 1) rounded up to fp16 (one fp16 step:
    # relative 2**-10 for normals, 2**-24 absolute for subnormals), the zero at most one step below the min
    if 128 % group_size:
        return
    groups = x.float().view(4, 3, -1, group_size)
    assert bool((q.zero.float() <= groups.amin(-1)).all())
    span = groups.amax(-1) - q.zero.float()
    assert bool((q.scale.float() <= span / (2**bits - 1) * (1 + 2**-10) + 2**-24).all())


def test_int8_error_is_small_against_the_values():
    x = torch.rand(64, 128, generator=torch.Generator().manual_seed(0)) * 8 - 4  # in [-4, 4)
    err = (quantize_minmax(x, 8).dequantize() - x).abs().max()
    # a group spans < 8: scale < 8/255 (1 + 2**-10), error < 4/255 (1 + 2**-10) < 0.0157; int4 would be 0.27
    assert err < 0.0157


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_constant_vectors_come_back_exactly(bits):
    x = torch.full((2, 64), 3.25)  # an fp16 value: zero point 3.25, scale 0
    q = quantize_minmax(x, bits)
    assert torch.equal(q.scale, torch.zeros_like(q.scale))
    assert torch.equal(q.dequantize(), x)
    # not an fp16 value: the zero point rounds down and the scale covers the gap
    y = torch.full((64,), 0.1)
    _assert_within_half_a_scale(y, quantize_minmax(y, bits))


@pytest.mark.parametrize("length", [1, 5, 33, 100])
def test_lengths_not_multiples_of_the_group(length):
    x = torch.randn(3, length, generator=torch.Generator().manual_seed(length))
    q = quantize_minmax(x, 4, group_size=32)
    num_groups = -(-length // 32)  # the last group is short
    assert q.scale.shape == q.zero.shape == (3, num_groups)
    assert q.data.shape == (3, -(-length // 2))  # two int4 codes per byte
    assert q.num_bytes == 3 * (-(-length // 2) + num_groups * 4)  # + fp16 scale and zero per group
    _assert_within_half_a_scale(x, q)


def test_extreme_values_at_fp16_range():
    x = torch.tensor([[-65504.0, 65504.0, 0.0, 1.0], [-65504.0, -65504.0, -65504.0, -65504.0]])
    for bits in (2, 4, 8):
        _assert_within_half_a_scale(x, quantize_minmax(x, bits, group_size=4))
    tiny = torch.tensor([1e-7, 2e-7, 3e-7, 0.0])  # a range below fp16's smallest normal
    _assert_within_half_a_scale(tiny, quantize_minmax(tiny, 8, group_size=4))


def test_bytes_are_real_codes_and_fp16_metadata():
    x = torch.randn(10, 128)
    # per vector: int8 128 bytes, int4 64, int2 32; plus 128 / 32 = 4 groups * (2 + 2) bytes = 16
    for bits, data in ((8, 128), (4, 64), (2, 32)):
        q = quantize_minmax(x, bits, 32)
        assert q.data.dtype == torch.uint8 and q.scale.dtype == q.zero.dtype == torch.float16
        assert q.num_bytes == 10 * (data + 16)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bits": 3}, "bits must be one of"),
        ({"bits": 16}, "bits must be one of"),
        ({"bits": 4, "group_size": 0}, "group_size must be a positive integer"),
        ({"bits": 4, "group_size": 2.5}, "group_size must be a positive integer"),
    ],
)
def test_bad_parameters_get_one_line_errors(kwargs, message):
    with pytest.raises(KVLibError, match=message) as info:
        quantize_minmax(torch.randn(4, 8), **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "x",
    [
        torch.arange(8, dtype=torch.int32),
        torch.randn(8).double(),
        torch.tensor([1.0, float("nan")]),
        torch.tensor([1.0, float("inf")]),
        torch.tensor([7e4, 0.0]),
    ],
)
def test_wrong_dtypes_and_values_are_refused(x):
    with pytest.raises(KVLibError, match="float32, float16 or bfloat16|not finite"):
        quantize_minmax(x, 8)


@settings(max_examples=200, deadline=None)
@example(values=[1.401298464324817e-45], bits=2, group_size=1)  # a span that divides to 0 (found by CI)
@example(values=[0.0, 1.401298464324817e-45, -1.401298464324817e-45], bits=8, group_size=3)
@given(
    values=st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=70),
    bits=st.sampled_from([2, 4, 8]),
    group_size=st.integers(1, 40),
)
def test_half_a_scale_for_any_values(values, bits, group_size):
    x = torch.tensor(values)
    _assert_within_half_a_scale(x, quantize_minmax(x, bits, group_size))
