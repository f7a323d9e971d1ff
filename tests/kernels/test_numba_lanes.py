"""The heads-in-lanes loops (kvlib.kernels.numba_lanes) give what the head_dim-in-lanes ones give,
on the same blocks: partial blocks, leftovers of fewer than eight tokens, block sizes from 1,
groups of 8 to 32 query heads, 16-bit storage and empty split ranges."""

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from kvlib.kernels.dispatch import decode_attention  # noqa: E402
from kvlib.kernels.numba_decode import FORMATS, as_numpy, attend_blocks  # noqa: E402
from kvlib.kernels.numba_lanes import attend_lanes  # noqa: E402
from tests.kernels.cases import RTOL, decode_case, reference, relative_error  # noqa: E402


def _both_ways(q, k_cache, v_cache, table, first, end, seq_len):
    """(m, denom, acc) of one sequence's blocks [first, end) from attend_lanes and from attend_blocks."""
    num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    k, v, fmt = as_numpy(k_cache), as_numpy(v_cache), FORMATS[k_cache.dtype]
    scratch = np.empty((1, block_size, num_kv_heads, head_dim), dtype=np.float32)
    results = []
    for lanes in (True, False):
        m, denom = np.empty(num_heads, np.float32), np.empty(num_heads, np.float32)
        acc = np.empty((num_heads, head_dim), np.float32)
        if lanes:
            attend_lanes(q.numpy(), k, v, table, first, end, seq_len, fmt, m, denom, acc, scratch)
        else:
            scores = np.empty((num_heads, block_size), np.float32)
            attend_blocks(q.numpy(), k, v, table, first, end, seq_len, fmt, m, denom, acc, scores, scratch)
        results.append((m, denom, acc))
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("group", [8, 16, 24, 32])
@pytest.mark.parametrize(
    ("block_size", "length"), [(1, 5), (5, 23), (8, 64), (16, 37), (24, 100), (128, 300)]
)
def test_lanes_equal_the_head_dim_loops(block_size, length, group, dtype):
    q, k, v, tables, lens = decode_case([length], block_size, num_kv_heads=2, group=group, dtype=dtype)
    num_blocks = -(-length // block_size)
    table = tables[0].numpy()
    for first, end in [(0, num_blocks), (0, num_blocks // 2), (num_blocks // 2, num_blocks)]:
        (m1, l1, a1), (m2, l2, a2) = _both_ways(q[0], k, v, table, first, end, length)
        if first == end:  # an empty split: nothing seen, weighs nothing in the merge
            assert np.all(m1 == -np.inf) and not l1.any() and not a1.any()
            continue
        assert np.allclose(m1, m2, rtol=1e-6, atol=1e-6)
        out1, out2 = a1 / l1[:, None], a2 / l2[:, None]
        assert np.abs(out1 - out2).max() < RTOL * np.abs(out2).max()


@pytest.mark.parametrize("head_dim", [8, 24, 40, 128])
def test_lanes_take_any_head_dim(head_dim):
    """head_dim need not be a multiple of a cache line (16 float32): the prefetch walks by lines."""
    inputs = decode_case([3, 40, 129], 16, num_kv_heads=2, group=8, head_dim=head_dim, seed=head_dim)
    for num_splits in (1, 2, 5):
        out = decode_attention(*inputs, kernel="numba", num_splits=num_splits)
        assert relative_error(out, reference(*inputs)) < RTOL
