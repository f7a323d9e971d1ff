"""A few rows times a weight matrix, in numba: the products of the lean decode step (chapter 1).

A decode step multiplies one row per sequence (its newest token) by every weight matrix of
the model: a matrix-vector product, which reads each weight once and does one multiply-add
with it. Its time is the time to stream the weights from memory. BLAS libraries tune their
products for many rows; with one, PyTorch's streamed about 7 GB/s on the development machine,
where this loop streamed 9 to 14 GB/s, at or above the DRAM probe of chapter 0 (the weights of
chapter 1's model partly fit the last-level cache).

:func:`rows_times_matrix` walks the weight matrix ``w`` (n_in, n_out) in the order of its
memory, four input rows at a time: for each slice of eight outputs it adds
``x[r, i] * w[i, o:o + 8]`` for those four ``i`` into the output row, which stays in the
L1 cache. With several threads each takes a slice of the columns. The sums run over ``i`` in
order, with fused multiply-adds, so the result differs from BLAS's only in rounding (about
1e-7 relative; tests/kernels/test_row_product.py).
"""

from __future__ import annotations

import torch
from numba import carray, njit, prange

from kvlib.kernels.numba_ops import float32_at
from kvlib.kernels.numba_setup import cached_njit, timed_first_call, use_numba_threads
from kvlib.kernels.numba_simd import LANES, vfma, vload, vsplat, vstore

INPUTS_AT_ONCE = 4  # rows of w added per pass over an output slice
PARALLEL_MIN_WEIGHTS = 1 << 16  # smaller matrices take the serial loop: starting threads costs more


@njit(inline="always")
def _add_rows(x, w, out, r, i, first, end):
    """out[r, first:end] += x[r, i:i + 4] @ w[i:i + 4, first:end], eight outputs at a time (end - first
    a multiple of 8)."""
    n_out = w.shape[1]
    x0, x1 = vsplat(x[r, i]), vsplat(x[r, i + 1])
    x2, x3 = vsplat(x[r, i + 2]), vsplat(x[r, i + 3])
    for o in range(first, end, LANES):
        at = r * n_out + o
        total = vfma(x0, vload(w, i * n_out + o), vload(out, at))
        total = vfma(x1, vload(w, (i + 1) * n_out + o), total)
        total = vfma(x2, vload(w, (i + 2) * n_out + o), total)
        vstore(out, at, vfma(x3, vload(w, (i + 3) * n_out + o), total))


@njit(inline="always")
def _slice_of_row(x, w, add, out, r, s, num_slices):
    """Row ``r`` of out = add + x @ w over column slice ``s`` of ``num_slices`` (see rows_times_matrix)."""
    n_in, n_out = w.shape
    whole = n_out - n_out % LANES
    first = s * (whole // LANES) // num_slices * LANES
    end = (s + 1) * (whole // LANES) // num_slices * LANES
    end_all = n_out if s == num_slices - 1 else end  # the last slice takes the columns past whole
    for o in range(first, end_all):
        out[r, o] = add[r, o] if add.shape[0] else 0.0
    i = 0
    while i + INPUTS_AT_ONCE <= n_in:
        _add_rows(x, w, out, r, i, first, end)
        i += INPUTS_AT_ONCE
    for j in range(i, n_in):  # inputs left over, one at a time
        xj = vsplat(x[r, j])
        for o in range(first, end, LANES):
            vstore(out, r * n_out + o, vfma(xj, vload(w, j * n_out + o), vload(out, r * n_out + o)))
    for o in range(end, end_all):  # columns left over, one at a time
        total = out[r, o]
        for j in range(n_in):
            total += x[r, j] * w[j, o]
        out[r, o] = total


@njit(inline="always")
def _arrays(x_at, w_at, add_at, out_at, rows, n_in, n_out):
    """The operands as arrays over the tensors' memory (``add_at`` 0: an empty ``add``)."""
    x = carray(float32_at(x_at), (rows, n_in))
    w = carray(float32_at(w_at), (n_in, n_out))
    add = carray(float32_at(add_at if add_at else out_at), (rows if add_at else 0, n_out))
    return x, w, add, carray(float32_at(out_at), (rows, n_out))


@cached_njit(parallel=True)
def rows_times_matrix(x_at, w_at, add_at, out_at, rows, n_in, n_out, num_slices):
    """out = add + x @ w (or x @ w when ``add_at`` is 0), in ``num_slices`` column slices run in parallel.

    The operands are given by address (:func:`~kvlib.kernels.numba_ops.float32_at`): x (rows, n_in),
    w (n_in, n_out), add and out (rows, n_out), all float32 and C-contiguous. The slices split
    the columns in multiples of eight; the last also takes the columns left over.
    """
    x, w, add, out = _arrays(x_at, w_at, add_at, out_at, rows, n_in, n_out)
    for item in prange(rows * num_slices):
        _slice_of_row(x, w, add, out, item // num_slices, item % num_slices, num_slices)


@cached_njit()
def rows_times_matrix_serial(x_at, w_at, add_at, out_at, rows, n_in, n_out):
    """:func:`rows_times_matrix` on the calling thread, in one slice: no thread pool to wake."""
    x, w, add, out = _arrays(x_at, w_at, add_at, out_at, rows, n_in, n_out)
    for r in range(rows):
        _slice_of_row(x, w, add, out, r, 0, 1)


def product(
    x: torch.Tensor, w: torch.Tensor, add: torch.Tensor | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """add + x @ w for checked CPU float32 tensors (see :func:`kvlib.kernels.row_product.row_product`),
    into ``out`` (rows, n_out) or a new tensor. Serial on one thread or for a small ``w``, else in
    column slices. The tensors stay referenced here while the kernel reads their memory."""
    x = x if x.is_contiguous() else x.contiguous()
    add = add if add is None or add.is_contiguous() else add.contiguous()
    (rows, n_in), n_out = x.shape, w.shape[1]
    out = torch.empty(rows, n_out) if out is None else out
    addresses = x.data_ptr(), w.data_ptr(), 0 if add is None else add.data_ptr(), out.data_ptr()
    if torch.get_num_threads() == 1 or w.numel() < PARALLEL_MIN_WEIGHTS:
        timed_first_call("rows", rows_times_matrix_serial, (*addresses, rows, n_in, n_out))
    else:
        slices = max(1, min(use_numba_threads(), n_out // 64))  # at least 64 columns a slice
        timed_first_call("rows-parallel", rows_times_matrix, (*addresses, rows, n_in, n_out, slices))
    return out
