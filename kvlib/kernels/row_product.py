"""``add + x @ w`` for the few rows of a decode step: the lean step's matrix products (chapter 1).

:func:`row_product` runs :func:`kvlib.kernels.numba_row_product.rows_times_matrix` where it applies
(a CPU, float32, at most ``MAX_ROWS`` rows, numba importable, no operand requiring a gradient) and
``torch.mm``/``torch.addmm`` everywhere else: prefills of many rows, GPUs, other dtypes,
training. Both compute the same product; they differ only in rounding.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from kvlib import KVLibError
from kvlib.kernels.dispatch import numba_module

MAX_ROWS = 8  # rows (sequences of a decode step) up to which the numba loop runs; more go to BLAS


@functools.cache
def numba_rows() -> ModuleType | None:
    """:mod:`kvlib.kernels.numba_row_product`, imported on first use, or None where numba cannot run."""
    if numba_module() is None:
        return None
    import kvlib.kernels.numba_row_product as module

    return module


def numba_applies(x: torch.Tensor, w: torch.Tensor, add: torch.Tensor | None = None) -> bool:
    """Does :func:`row_product` take the numba loop for these operands? (It reads their memory by
    address, so every operand must be a float32 CPU tensor; PyTorch takes, or refuses, the rest.)"""
    operands = (x, w) if add is None else (x, w, add)
    return (
        x.shape[0] <= MAX_ROWS
        and all(t.dtype == torch.float32 and t.device.type == "cpu" and not t.requires_grad for t in operands)
        and w.is_contiguous()
        and numba_rows() is not None
    )


def row_product(
    x: torch.Tensor, w: torch.Tensor, add: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ w``, plus ``add`` if given: x (rows, n_in), w (n_in, n_out), add (rows, n_out) -> (rows, n_out).

    ``out`` (rows, n_out), contiguous, receives the result (no allocation); it may be ``add`` itself
    (a residual updated in place) but must not overlap x. No gradient flows through the numba
    loop, so operands that require one take PyTorch's.
    """
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
        raise KVLibError(
            f"cannot multiply x {tuple(x.shape)} by w {tuple(w.shape)}: need (rows, n) and (n, m)"
        )
    shape = (x.shape[0], w.shape[1])
    for name, tensor in (("add", add), ("out", out)):
        if tensor is not None and tensor.shape != shape:
            raise KVLibError(f"{name} must be {shape}, the product's shape, not {tuple(tensor.shape)}")
    if out is not None and not (out.is_contiguous() and out.dtype == x.dtype and out.device == x.device):
        raise KVLibError(f"out must be a contiguous {x.dtype} tensor on {x.device}")
    if numba_applies(x, w, add):
        return numba_rows().product(x, w, add, out)
    if add is None:
        return torch.mm(x, w, out=out)
    if out is add:
        return add.addmm_(x, w)
    return torch.addmm(add, x, w, out=out)
