"""Tests of kvlib.quant.formats: bytes per token worked by hand, agreeing with chapter 2's KVDtype."""

import pytest

from kvlib import KVLibError
from kvlib.quant.formats import KVQuantFormat, kv_quant_format
from kvlib.sizing.dtypes import kv_dtype


def test_bytes_per_token_for_head_dim_128():
    # K and V of one token in one KV head, group 32: codes + 128/32 = 4 groups * 4 bytes (fp16 scale + zero)
    assert kv_quant_format("int8").quantized_bytes_per_token(128) == 2 * (128 + 16)  # 288
    assert kv_quant_format("int4").quantized_bytes_per_token(128) == 2 * (64 + 16)  # 160
    assert kv_quant_format("int2").quantized_bytes_per_token(128) == 2 * (32 + 16)  # 96
    assert kv_quant_format("fp8").quantized_bytes_per_token(128) == 2 * (128 + 2)  # one fp16 scale each
    # KIVI, R = 128: keys 64 code bytes + 128 channels * 4 bytes / 128 tokens; values as int4 per token
    assert kv_quant_format("kivi4").quantized_bytes_per_token(128) == (64 + 4) + (64 + 16)  # 148
    assert kv_quant_format("kivi2").quantized_bytes_per_token(128) == (32 + 4) + (32 + 16)  # 84


def test_per_token_int8_and_int4_are_chapter_2s_dtypes():
    for name in ("int8", "int4"):
        assert kv_quant_format(name).token_dtype(128) == kv_dtype(name)
        assert kv_quant_format(name).quantized_bytes_per_token(96) == 2 * kv_dtype(name).vector_bytes(96)


def test_context_bytes_count_the_residual_in_full_precision():
    kivi = kv_quant_format("kivi4", residual_length=64)
    # 300 tokens: 4 groups of 64 quantized, 44 in the residual at fp16 (2 bytes * 2 * 128 each)
    keys = 4 * 128 * (32 + 4)  # per group: 128 channels * (64 tokens * 4 bits / 8 + fp16 scale and zero)
    values = 256 * (64 + 16)
    assert kivi.num_residual(300) == 44
    assert kivi.context_bytes(300, 128) == keys + values + 44 * 2 * 128 * 2
    assert kv_quant_format("int4").context_bytes(300, 128) == 300 * 160  # no residual by default
    assert kv_quant_format("int4", residual_length=128).context_bytes(300, 128) == 256 * 160 + 44 * 512
    assert kv_quant_format("none").context_bytes(300, 128, element_bytes=4) == 300 * 2 * 128 * 4


def test_defaults():
    assert kv_quant_format("int4").group_size == 32 and kv_quant_format("fp8").group_size is None
    assert kv_quant_format("kivi2").residual_length == 128 and kv_quant_format("int2").residual_length == 0
    assert kv_quant_format("kivi2").per_channel_keys and not kv_quant_format("int2").per_channel_keys


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: kv_quant_format("int3"), "unknown KV quantization format"),
        (lambda: KVQuantFormat("int4", 3, 32, 0, False), "bits must be one of"),
        (lambda: kv_quant_format("int4", group_size=0), "group_size must be a positive integer"),
        (lambda: kv_quant_format("int4", residual_length=-1), "residual_length must be a non-negative"),
        (lambda: kv_quant_format("kivi4", residual_length=0), "residual_length must be >= 1"),
    ],
)
def test_bad_parameters_get_one_line_errors(make, message):
    with pytest.raises(KVLibError, match=message) as info:
        make()
    assert "\n" not in str(info.value)
