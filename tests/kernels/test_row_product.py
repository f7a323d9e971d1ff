"""row_product: add + x @ w by the numba loop where it applies, by PyTorch elsewhere, the same
product either way (to float32 rounding), with one-line errors for operands that cannot multiply."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.kernels import row_product as module
from kvlib.kernels.row_product import MAX_ROWS, numba_applies, row_product
from kvlib.measure.timing import torch_threads

pytest.importorskip("numba")


def _operands(rows, n_in, n_out, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(rows, n_in, generator=g),
        torch.randn(n_in, n_out, generator=g),
        torch.randn(rows, n_out, generator=g),
    )


def _close(out, expected):
    """Within float32 rounding of sums of n_in terms: relative to the largest magnitude."""
    return (out - expected).abs().max() <= 1e-5 * expected.abs().max().clamp(min=1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
@pytest.mark.parametrize(
    ("n_in", "n_out"), [(1, 1), (3, 7), (4, 8), (7, 9), (64, 130), (384, 640), (1024, 384)]
)
def test_the_numba_loop_equals_pytorchs_product(threads, rows, n_in, n_out):
    x, w, add = _operands(rows, n_in, n_out, seed=n_in + n_out)
    assert numba_applies(x, w)
    with torch_threads(threads):  # two threads: column slices in parallel for the larger matrices
        assert _close(row_product(x, w), x @ w)
        assert _close(row_product(x, w, add=add), add + x @ w)


def test_non_contiguous_rows_and_residuals_are_read_correctly():
    x, w, add = _operands(4, 32, 48)
    x_t = torch.randn(32, 4).t()  # a transposed view
    add_t = torch.randn(48, 4).t()
    assert _close(row_product(x_t, w, add=add_t), add_t + x_t @ w)
    assert _close(row_product(x[:, ::2].contiguous(), w[::2].contiguous()), x[:, ::2] @ w[::2])


@pytest.mark.parametrize(
    "case",
    ["many rows", "float64", "transposed w", "needs grad", "numba missing"],
)
def test_pytorch_takes_what_the_loop_does_not(case, monkeypatch):
    x, w, add = _operands(MAX_ROWS + 1 if case == "many rows" else 2, 16, 24)
    if case == "float64":
        x, w, add = x.double(), w.double(), add.double()
    if case == "transposed w":
        w = torch.randn(24, 16).t()
    if case == "needs grad":
        w.requires_grad_(True)
    if case == "numba missing":
        monkeypatch.setattr(module, "numba_rows", lambda: None)
    assert not numba_applies(x, w)
    out = row_product(x, w, add=add)
    assert torch.equal(out, torch.addmm(add, x, w))
    if case == "needs grad":  # the gradient flows through PyTorch's product
        out.sum().backward()
        assert torch.allclose(w.grad, x.sum(0)[:, None].expand(16, 24))


@pytest.mark.parametrize(
    ("x", "w", "add", "message"),
    [
        (torch.ones(2, 3), torch.ones(4, 5), None, "cannot multiply x (2, 3) by w (4, 5)"),
        (torch.ones(3), torch.ones(3, 5), None, "cannot multiply x (3,)"),
        (torch.ones(2, 3), torch.ones(3, 5), torch.ones(5), "add must be (2, 5)"),
    ],
)
def test_operands_that_cannot_multiply_get_one_line(x, w, add, message):
    with pytest.raises(KVLibError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        row_product(x, w, add=add)
    assert "\n" not in str(error.value)


def test_the_first_calls_compile_time_is_reported():
    from kvlib.kernels.numba_setup import jit_seconds

    x, w, _ = _operands(1, 16, 8)
    with torch_threads(1):
        row_product(x, w)
    assert jit_seconds()["rows"] > 0


def test_operands_of_another_dtype_or_device_go_to_pytorch():
    """The loop reads memory by address: a residual of another dtype, or any operand off the CPU (here
    the meta device, which every machine has), must take PyTorch's product instead."""
    x, w, add = _operands(2, 16, 24)
    assert not numba_applies(x, w, add.double()) and not numba_applies(x, w, add.to("meta"))
    assert not numba_applies(x, w.to("meta")) and not numba_applies(x.to("meta"), w)
    with pytest.raises(RuntimeError, match="dtype"):  # PyTorch's refusal, not the loop misreading float64
        row_product(x, w, add=add.double())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("loop", [True, False], ids=["numba", "pytorch"])
def test_out_receives_the_product_and_may_be_the_residual(threads, loop, monkeypatch):
    """out= writes in place (the lean decode step's buffers), the residual updated in place too."""
    if not loop:
        monkeypatch.setattr(module, "numba_rows", lambda: None)
    x, w, add = _operands(3, 64, 640)
    expected_plain, expected_added = x @ w, add + x @ w
    out = torch.full((3, 640), float("nan"))
    with torch_threads(threads):
        assert row_product(x, w, out=out) is out and _close(out, expected_plain)
        assert row_product(x, w, add=add, out=out) is out and _close(out, expected_added)
        residual = add.clone()
        assert row_product(x, w, add=residual, out=residual) is residual
    assert _close(residual, expected_added)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (torch.empty(2, 4), r"out must be \(2, 5\)"),
        (torch.empty(5, 2).t(), "out must be a contiguous torch.float32"),
        (torch.empty(2, 5, dtype=torch.float64), "out must be a contiguous torch.float32"),
    ],
)
def test_an_out_that_cannot_hold_the_product_gets_one_line(out, message):
    with pytest.raises(KVLibError, match=message) as error:
        row_product(torch.ones(2, 3), torch.ones(3, 5), out=out)
    assert "\n" not in str(error.value)
