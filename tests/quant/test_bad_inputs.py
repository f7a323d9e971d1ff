"""A hostile round on kvlib.quant: each bad call is a one-line KVLibError naming the
argument, or a right, finite answer.

Found in the round: a group_size of 10**30 was a TypeError from torch's pad (and one of 10**9 would
have padded every vector to 10**9 values), a batch of no vectors was a RuntimeError from view, a
meta tensor one from .item(); KVQuantFormat.token_dtype, num_residual and quantized_bytes_per_token
took a head_dim of 0, -1 or 1.5 and a token count of -1 or NaN without a word."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kvlib import KVLibError
from kvlib.quant.formats import kv_quant_format
from kvlib.quant.fp8 import quantize_fp8
from kvlib.quant.minmax import quantize_minmax
from kvlib.quant.packing import pack_codes, unpack_codes
from kvlib.quant.store import QuantizedKVStore

X = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))


def one_line(call, *words):
    with pytest.raises(KVLibError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and len(message) < 300 and all(w in message for w in words), message


@pytest.mark.parametrize("group_size", [10**9, 10**30, np.int64(10**12), 65, 64])
def test_a_group_larger_than_the_vector_is_one_group_of_it(group_size):
    assert torch.equal(quantize_minmax(X, 4, group_size).dequantize(), quantize_minmax(X, 4, 64).dequantize())
    assert torch.equal(quantize_fp8(X, group_size).dequantize(), quantize_fp8(X).dequantize())


@pytest.mark.parametrize("group_size", [0, -1, 1.5, math.nan, None, "32", True])
def test_a_group_size_that_is_not_a_positive_integer_is_named(group_size):
    one_line(lambda: quantize_minmax(X, 4, group_size), "group_size")
    if group_size is not None:  # None is fp8's "one group per vector"
        one_line(lambda: quantize_fp8(X, group_size), "group_size")


@pytest.mark.parametrize("bits", [0, -4, 3, 16, 10**9, math.nan, None, "4", True, 4.0])
def test_bits_other_than_2_4_8_are_named(bits):
    one_line(lambda: quantize_minmax(X, bits), "bits")
    one_line(lambda: pack_codes(torch.tensor([1, 2], dtype=torch.uint8), bits), "bits")


@pytest.mark.parametrize("rows", [0, 2])
def test_no_vectors_quantize_to_no_vectors(rows):
    x = torch.zeros(rows, 0, 40)
    for quantize in (lambda t: quantize_minmax(t, 4, 32), quantize_fp8):
        assert quantize(x).dequantize().shape == x.shape


@pytest.mark.parametrize(
    "x, words",
    [
        (torch.zeros(2, 32, device="meta"), ("meta",)),
        ([[1.0, 2.0]], ("float32, float16 or bfloat16 tensor", "list")),
        (np.zeros((2, 32), dtype=np.float32), ("tensor", "ndarray")),
        (torch.ones(1, 32, dtype=torch.int64), ("torch.int64",)),
        (torch.ones(1, 32, dtype=torch.bool), ("torch.bool",)),
        (torch.ones(1, 32, dtype=torch.complex64), ("torch.complex64",)),
        (torch.randn(2, 32, dtype=torch.float64), ("torch.float64",)),
        (torch.full((1, 32), math.nan), ("not finite",)),
        (torch.full((1, 32), math.inf), ("not finite",)),
        (torch.full((1, 32), 1e30), ("fp16's range",)),
        (torch.tensor(1.0), ("non-empty last dim",)),
        (torch.zeros(2, 0), ("non-empty last dim",)),
    ],
)
def test_what_is_no_float_tensor_in_range_is_named(x, words):
    one_line(lambda: quantize_minmax(x, 4), *words)
    one_line(lambda: quantize_fp8(x), *words)


@pytest.mark.parametrize("length", [-1, 1.5, math.nan, None, 10**30, "4"])
def test_unpack_names_a_length_it_cannot_hold(length):
    one_line(lambda: unpack_codes(torch.zeros(2, dtype=torch.uint8), 4, length), "length")


@pytest.mark.parametrize(
    "codes", [torch.tensor([1.0, 2.0]), torch.tensor([-1, 2]), torch.tensor([2**40]), [1, 2], torch.tensor(1)]
)
def test_pack_names_codes_it_cannot_pack(codes):
    one_line(lambda: pack_codes(codes, 8), "codes")


FORMAT = kv_quant_format("int4")


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: FORMAT.token_dtype(0), ("head_dim", "0")),
        (lambda: FORMAT.token_dtype(-1), ("head_dim", "-1")),
        (lambda: FORMAT.token_dtype(1.5), ("head_dim", "1.5")),
        (lambda: FORMAT.quantized_bytes_per_token(0), ("head_dim",)),
        (lambda: FORMAT.quantized_bytes_per_token(math.nan), ("head_dim", "nan")),
        (lambda: FORMAT.num_residual(-1), ("num_tokens", "-1")),
        (lambda: FORMAT.num_residual(math.nan), ("num_tokens", "nan")),
        (lambda: kv_quant_format("none").num_residual(-5), ("num_tokens", "-5")),
        (lambda: FORMAT.context_bytes(10, 128, 0), ("element_bytes",)),
        (lambda: FORMAT.context_bytes("10", 128), ("num_tokens",)),
        (lambda: kv_quant_format("int4", group_size=0), ("group_size",)),
        (lambda: kv_quant_format("int4", residual_length=-1), ("residual_length",)),
        (lambda: kv_quant_format("__class__"), ("unknown KV quantization format",)),
        (lambda: kv_quant_format(["int4"]), ("unknown KV quantization format",)),
        (lambda: QuantizedKVStore("int4"), ("fmt",)),
    ],
)
def test_format_methods_name_their_bad_arguments(call, words):
    one_line(call, *words)


def test_a_format_group_larger_than_the_head_is_one_group_of_it():
    """kv_quant_format("int4", group_size=10**30) sizes a 128-value head as one group of 128."""
    huge = kv_quant_format("int4", group_size=10**30)
    assert huge.token_dtype(128) == kv_quant_format("int4", group_size=128).token_dtype(128)
    assert huge.context_bytes(1000, 128) == kv_quant_format("int4", group_size=128).context_bytes(1000, 128)


@pytest.mark.parametrize(
    "k, v, words",
    [
        (torch.randn(64), torch.randn(64), ("k",)),
        (torch.randn(1, 2, 4, 64), torch.randn(1, 2, 4, 32), ("v",)),
        (torch.full((1, 2, 4, 64), math.nan), torch.randn(1, 2, 4, 64), ("not finite",)),
        ([[1.0]], [[1.0]], ("k",)),
    ],
)
def test_the_store_names_what_it_cannot_append(k, v, words):
    one_line(lambda: QuantizedKVStore(kv_quant_format("int4")).append(k, v), *words)
