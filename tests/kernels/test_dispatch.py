"""decode_attention checks its inputs with one clear line, picks a kernel per device (the torch
reference where numba cannot be imported), chooses split-K when the kernel's work items leave threads idle,
and runs the same kernel on contiguous memory through an identity block table."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.kernels import dispatch
from kvlib.kernels.dispatch import (
    KERNELS,
    MIN_SPLIT_TOKENS,
    as_blocks,
    choose_num_splits,
    contiguous_tables,
    decode_attention,
    default_kernel,
    kernel_info,
    work_items,
)
from kvlib.kernels.triton_decode import merge_partials
from tests.kernels.cases import RTOL, decode_case, reference, relative_error


def test_split_k_only_when_the_work_items_leave_threads_idle():
    assert choose_num_splits(num_items=16, max_seq_len=4096, num_workers=16) == 1
    assert choose_num_splits(num_items=1, max_seq_len=4096, num_workers=16) == 16
    assert choose_num_splits(num_items=2, max_seq_len=4096, num_workers=7) == 4
    # every split keeps at least MIN_SPLIT_TOKENS tokens
    assert choose_num_splits(1, 3 * MIN_SPLIT_TOKENS, 16) == 3
    assert choose_num_splits(1, 10, 16) == 1


def test_numba_items_are_sequences_and_triton_items_sequences_times_kv_heads():
    assert work_items("numba", batch=4, num_kv_heads=8) == 4
    assert work_items("triton", batch=4, num_kv_heads=8) == 32


def test_the_default_kernel_per_device_and_the_fallback(monkeypatch):
    assert default_kernel("meta") == "torch"
    assert default_kernel(None) == default_kernel("cpu") in ("numba", "torch")
    monkeypatch.setattr(dispatch, "numba_module", lambda: None)  # a platform without numba wheels
    assert default_kernel("cpu") == "torch" and kernel_info()["kernel"] == "torch"
    inputs = decode_case([3, 20], 4, num_kv_heads=2, group=2)
    assert relative_error(decode_attention(*inputs), reference(*inputs)) < RTOL
    with pytest.raises(KVLibError, match="needs numba"):
        decode_attention(*inputs, kernel="numba")


def test_kernel_info_names_the_kernel_and_its_compile_time():
    decode_attention(*decode_case([3], 4, 1, 1), kernel=default_kernel("cpu"))
    info = kernel_info()
    assert set(info) == {"kernel", "numba", "numba_threads", "jit_seconds", "triton"}
    assert info["kernel"] in KERNELS
    if info["numba"] is not None:
        assert info["numba_threads"] >= 1 and info["jit_seconds"]["float32"] > 0


@pytest.mark.parametrize("kernel", ["torch", "numba"])
def test_the_torch_reference_runs_through_the_same_entry_point(kernel):
    if kernel == "numba":
        pytest.importorskip("numba")
    inputs = decode_case([1, 17, 70], 16, num_kv_heads=2, group=4)
    assert relative_error(decode_attention(*inputs, kernel=kernel), reference(*inputs)) < RTOL


@pytest.mark.parametrize("block_size", [None, 16])
def test_the_contiguous_baseline_reads_the_same_values_through_an_identity_table(block_size):
    torch.manual_seed(0)
    k, v = torch.randn(2, 2, 64, 2, 16).unbind(0)  # (batch, seq_len, kv_heads, head_dim) each
    q = torch.randn(2, 8, 16)
    tables = contiguous_tables(2, 64, block_size)
    assert tables.tolist() == ([[0], [1]] if block_size is None else [list(range(4)), list(range(4, 8))])
    k_blocks, v_blocks = as_blocks(k, block_size), as_blocks(v, block_size)
    assert k_blocks.data_ptr() == k.data_ptr()  # a view, not a copy
    lens = torch.tensor([64, 64])
    out = decode_attention(q, k_blocks, v_blocks, tables, lens)
    assert relative_error(out, reference(q, k_blocks, v_blocks, tables, lens)) < RTOL
    with pytest.raises(KVLibError, match="does not divide"):
        as_blocks(k, 24)
    with pytest.raises(KVLibError, match="contiguous"):
        as_blocks(k.transpose(0, 1))


def test_merge_partials_equals_one_pass():
    """The Triton kernel's log-sum-exp merge, checked on the CPU: softmax over 3 uneven splits
    (one empty) merged equals softmax over all keys."""
    torch.manual_seed(1)
    scores, values = torch.randn(2, 3, 50), torch.randn(2, 3, 50, 8)  # (batch, heads, keys[, hd])
    bounds = [(0, 20), (20, 20), (20, 50)]
    part_m, part_l, part_acc = [], [], []
    for lo, hi in bounds:
        s = scores[..., lo:hi]
        m = s.amax(-1) if hi > lo else torch.full(s.shape[:-1], float("-inf"))
        w = torch.exp(s - m[..., None]) if hi > lo else s
        part_m.append(m)
        part_l.append(w.sum(-1))
        part_acc.append((w[..., None] * values[..., lo:hi, :]).sum(-2))
    merged = merge_partials(torch.stack(part_m, -1), torch.stack(part_l, -1), torch.stack(part_acc, -2))
    expected = (torch.softmax(scores, -1)[..., None] * values).sum(-2)
    assert torch.allclose(merged, expected, atol=1e-6)


def bad(**changes):
    q, k, v, tables, lens = decode_case([5, 9], 4, num_kv_heads=2, group=2)
    args = dict(q=q, k_cache=k, v_cache=v, block_tables=tables, seq_lens=lens) | changes
    kernel = args.pop("kernel", "numba")
    num_splits = args.pop("num_splits", None)
    out = args.pop("out", None)
    return lambda: decode_attention(*args.values(), kernel=kernel, num_splits=num_splits, out=out)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(kernel="cuda"), "unknown kernel 'cuda'"),
        (dict(q=torch.zeros(2, 4, 1, 16)), "q must be"),
        (dict(v_cache=torch.zeros(3, 4, 2, 16)), "differ"),
        (dict(k_cache=torch.zeros(6, 4, 2, 16, dtype=torch.int32)), "differ"),
        (dict(q=torch.zeros(2, 3, 16)), "KV heads"),
        (dict(q=torch.zeros(2, 4, 8)), "KV heads"),
        (dict(block_tables=torch.zeros(2, 3)), "int32 or int64"),
        (dict(seq_lens=torch.tensor([5.0, 9.0])), "integer"),
        (dict(seq_lens=torch.tensor([5])), "batch sizes differ"),
        (dict(seq_lens=torch.tensor([0, 9])), r"seq_lens must lie in 1\.\.12"),
        (dict(seq_lens=torch.tensor([5, 13])), r"seq_lens must lie in 1\.\.12"),
        (dict(block_tables=torch.tensor([[0, 1, 9], [2, 3, 4]])), "outside 0..4"),
        (dict(num_splits=0), "num_splits"),
        (dict(out=torch.zeros(2, 4, 8)), "out must be"),
        (dict(kernel="triton"), "triton kernel needs"),
    ],
)
def test_bad_inputs_are_named_in_one_line(changes, message):
    if changes.get("kernel", "numba") == "numba":
        pytest.importorskip("numba")
    with pytest.raises(KVLibError, match=message) as error:
        bad(**changes)()
    assert "\n" not in str(error.value)


def test_the_numba_kernel_needs_contiguous_caches_and_float_caches_all_around():
    pytest.importorskip("numba")
    q, k, v, tables, lens = decode_case([5, 9], 4, num_kv_heads=2, group=2)
    wide = torch.zeros(k.shape[0], 4, 2, 32)[..., :16]  # same shape, rows strided
    with pytest.raises(KVLibError, match="contiguous"):
        decode_attention(q, wide, wide, tables, lens, kernel="numba")
    with pytest.raises(KVLibError, match="float32, float16 or bfloat16"):
        decode_attention(q, k.double(), v.double(), tables, lens)
