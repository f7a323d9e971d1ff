"""The numba decode kernel equals the PyTorch reference (see tests/kernels/cases.py for the
tolerance) over block sizes, group sizes, lengths from 1, mixed batches and storage dtypes, with
split-K on and off; and its float16 conversion is exact."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.kernels.dispatch import decode_attention
from tests.kernels.cases import RTOL, decode_case, reference, relative_error

pytest.importorskip("numba")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LENGTHS = [1, 17, 130, 300]  # one token, partial last blocks, several blocks of 128


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", [1, 4, 8, 32])
@pytest.mark.parametrize("block_size", [1, 16, 128])
def test_numba_equals_the_reference(block_size, group, dtype):
    inputs = decode_case(LENGTHS, block_size, num_kv_heads=2, group=group, dtype=dtype, seed=block_size)
    ref = reference(*inputs)
    for num_splits in (1, 3, None):
        out = decode_attention(*inputs, kernel="numba", num_splits=num_splits)
        assert out.shape == ref.shape and out.dtype == torch.float32
        assert relative_error(out, ref) < RTOL, num_splits


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 200), min_size=1, max_size=4),
    block_size=st.sampled_from([1, 3, 16, 128]),
    num_kv_heads=st.integers(1, 3),
    group=st.sampled_from([1, 2, 4, 8, 32]),
    head_dim=st.sampled_from([8, 16, 24]),
    dtype=st.sampled_from(DTYPES),
    num_splits=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_numba_equals_the_reference_on_random_shapes(
    lengths, block_size, num_kv_heads, group, head_dim, dtype, num_splits, seed
):
    inputs = decode_case(lengths, block_size, num_kv_heads, group, head_dim, dtype, seed)
    split = decode_attention(*inputs, kernel="numba", num_splits=num_splits)
    assert relative_error(split, reference(*inputs)) < RTOL
    assert relative_error(split, decode_attention(*inputs, kernel="numba", num_splits=1)) < RTOL


def test_more_splits_than_blocks_leave_empty_splits_that_weigh_nothing():
    inputs = decode_case([1, 5, 40], 16, num_kv_heads=1, group=4)
    assert relative_error(decode_attention(*inputs, kernel="numba", num_splits=8), reference(*inputs)) < RTOL


def test_int32_tables_and_a_float16_query_are_accepted():
    q, k, v, tables, lens = decode_case([9, 33], 8, num_kv_heads=2, group=2, dtype=torch.float16)
    out = decode_attention(q.half(), k, v, tables.int(), lens.int(), kernel="numba")
    assert out.dtype == torch.float16
    assert relative_error(out, reference(q.half(), k, v, tables, lens)) < 1e-3  # the output's rounding


def test_the_kernel_writes_into_out_when_given():
    inputs = decode_case([9, 33], 8, num_kv_heads=2, group=2)
    out = torch.full(inputs[0].shape, float("nan"))
    assert decode_attention(*inputs, kernel="numba", out=out) is out
    assert relative_error(out, reference(*inputs)) < RTOL


def test_float16_bits_convert_exactly_subnormals_inf_and_nan_included():
    from numba import njit

    from kvlib.kernels.numba_ops import half_to_float

    @njit
    def convert(bits, out):
        for i in range(bits.shape[0]):
            out[i] = half_to_float(bits[i])

    bits = np.arange(2**16, dtype=np.uint16)
    out = np.empty(bits.shape, dtype=np.float32)
    convert(bits, out)
    expected = torch.from_numpy(bits.view(np.int16).copy()).view(torch.float16).float().numpy()
    assert np.array_equal(out, expected, equal_nan=True)


def test_the_softmax_exponential_is_accurate_to_float32():
    from numba import njit

    from kvlib.kernels.numba_ops import exp_nonpositive

    @njit
    def exp_all(x, out):
        for i in range(x.shape[0]):
            out[i] = exp_nonpositive(x[i])

    x = np.append(-np.linspace(0, 80, 100_001), [-np.inf, -200.0]).astype(np.float32)
    out = np.empty_like(x)
    exp_all(x, out)
    exact = np.exp(x[:-2].astype(np.float64))
    assert (np.abs(out[:-2] - exact) / exact).max() < 2e-7  # about one float32 ulp
    assert out[-2] == 0 and out[-1] == 0


def test_the_kernel_runs_on_torchs_thread_count():
    """One setting for both libraries: a one-thread step runs its attention on that one thread."""
    import numba

    from kvlib.kernels.numba_setup import numba_threads
    from kvlib.measure.timing import torch_threads

    inputs = decode_case([40, 9], 8, num_kv_heads=2, group=2)
    with torch_threads(1):
        assert numba_threads() == 1
        decode_attention(*inputs, kernel="numba")
        assert numba.get_num_threads() == 1
    with torch_threads(numba.config.NUMBA_NUM_THREADS):
        assert numba_threads() == numba.config.NUMBA_NUM_THREADS
        out = decode_attention(*inputs, kernel="numba")
        assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    assert relative_error(out, reference(*inputs)) < RTOL
