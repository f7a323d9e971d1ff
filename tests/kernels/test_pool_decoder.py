"""PoolDecoder: the numba kernel bound to a cache's pools equals the PyTorch reference (tolerance:
tests/kernels/cases.py), writes into the tensor it is given, and adapts to batches that change."""

import pytest
import torch

from kvlib.kernels.pool_decoder import MAX_VIEWS, PoolDecoder, pool_decoder_runs
from kvlib.measure.timing import torch_threads
from tests.kernels.cases import RTOL, decode_case, reference, relative_error

pytest.importorskip("numba")


def _decode(decoder, inputs, layer=0, out=None):
    q, _, _, tables, lens = inputs
    return decoder.attend(layer, q[:, :, None], tables, lens, int(lens.max()), out)[:, :, 0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [1, 16])
def test_the_bound_kernel_equals_the_reference(block_size, group, dtype, threads):
    inputs = decode_case([1, 17, 130, 300], block_size, num_kv_heads=2, group=group, dtype=dtype)
    decoder = PoolDecoder([inputs[1]], [inputs[2]])
    with torch_threads(threads):  # two threads and one sequence of 300 tokens: split-K on
        assert relative_error(_decode(decoder, inputs), reference(*inputs)) < RTOL


def test_out_is_written_and_returned_and_layers_read_their_own_pools():
    first = decode_case([5, 40], 16, num_kv_heads=2, group=2, seed=1)
    second = decode_case([5, 40], 16, num_kv_heads=2, group=2, seed=2)
    decoder = PoolDecoder([first[1], second[1]], [first[2], second[2]])
    out = torch.full((2, 4, 1, 16), float("nan"))
    q, _, _, tables, lens = second
    assert decoder.attend(1, q[:, :, None], tables, lens, 40, out) is out
    assert relative_error(out[:, :, 0], reference(*second)) < RTOL
    assert relative_error(_decode(decoder, first, layer=0), reference(*first)) < RTOL


def test_a_batch_that_grows_and_shrinks_between_steps_gets_the_right_rows():
    decoder = None
    for lengths in ([3, 9], [3, 9, 50, 2], [7]):  # the paged engine's batch changes every step
        inputs = decode_case(lengths, 4, num_kv_heads=1, group=4, seed=len(lengths))
        decoder = decoder or PoolDecoder([inputs[1]], [inputs[2]])
        decoder.k, decoder.v = [decoder.kernel.as_numpy(inputs[1])], [decoder.kernel.as_numpy(inputs[2])]
        assert relative_error(_decode(decoder, inputs), reference(*inputs)) < RTOL


def test_the_numpy_views_it_keeps_are_bounded():
    inputs = decode_case([3, 9], 4, num_kv_heads=1, group=1)
    decoder = PoolDecoder([inputs[1]], [inputs[2]])
    for _ in range(2 * MAX_VIEWS):
        _decode(decoder, inputs, out=torch.empty(2, 1, 1, 16))  # a new output tensor: a new view each time
    assert len(decoder._views) <= MAX_VIEWS


def test_it_runs_on_cpu_pools_only():
    assert pool_decoder_runs("cpu", torch.float16) and pool_decoder_runs(None, torch.float32)
    assert not pool_decoder_runs("meta", torch.float32) and not pool_decoder_runs("cpu", torch.float64)
