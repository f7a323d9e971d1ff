"""Tests of kvlib.chapters.ch03_paged_attention.kernel_overhead's fused-kernel comparison: the contiguous
baseline is the
same K/V in order behind an identity block table and computes what the paged kernel computes; the
rows carry the stated ratio and table share; it runs on one CPU thread, timed by that thread's
CPU time; bench() reports its fields. Nothing is timed for its value."""

import pytest
import torch

from kvlib.chapters.ch03_paged_attention import kernel_overhead as overhead
from kvlib.kernels.dispatch import KERNELS, decode_attention
from kvlib.measure import timing

SIZES = overhead.KernelSizes(
    batch=2, num_heads=4, num_kv_heads=2, head_dim=8, lengths=(32,), dtype=torch.float32
)


def test_fused_rows_carry_the_ratio_and_the_table_share():
    rows = overhead.time_fused_overhead(
        block_sizes=(4, 8), sizes=SIZES, device="cpu", rounds=1, kernel="torch"
    )
    assert [(r["length"], r["block_size"], r["kernel"]) for r in rows] == [(32, 4, "torch"), (32, 8, "torch")]
    for r in rows:
        # one 8-byte entry per block (a CPU kernel's work item is a whole sequence) against
        # 2 x 4 bytes x head_dim x num_kv_heads per token
        assert r["table_share"] == pytest.approx(8 / (2 * 4 * 8 * 2 * r["block_size"]))
        assert r["ratio"] == pytest.approx(r["paged_ms"] / r["contiguous_ms"])  # one round: its own ratio
        assert r["kv_bytes"] == SIZES.kv_bytes(32)


def test_fused_timing_runs_on_one_cpu_thread_timed_by_its_cpu_time(monkeypatch):
    """Like the gather's timing: a parallel kernel on a shared machine waits for a descheduled
    thread, and the wall clock counts other programs' time."""
    seen = []
    timed = overhead.time_interleaved

    def spy(fns, **options):
        seen.append((torch.get_num_threads(), options.get("clock")))
        return timed(fns, **options)

    monkeypatch.setattr(overhead, "time_interleaved", spy)
    overhead.time_fused_overhead(block_sizes=(8,), sizes=SIZES, device="cpu", rounds=1, kernel="torch")
    assert seen == [(1, None)]  # None: time_interleaved's clock_for one CPU thread, its CPU time
    assert timing.clock_for("cpu", 1) == "thread"


def test_the_identity_table_baseline_computes_what_the_paged_kernel_computes():
    q, k_cache, v_cache, tables, seq_lens, k, v = overhead.timing_case(32, 8, SIZES, seed=3, device="cpu")
    q = q.squeeze(2)
    identity = torch.arange(tables.numel()).view(tables.shape)
    blocks = (-1, 8, SIZES.num_kv_heads, SIZES.head_dim)
    contiguous = decode_attention(q, k.reshape(blocks), v.reshape(blocks), identity, seq_lens, kernel="torch")
    paged = decode_attention(q, k_cache, v_cache, tables, seq_lens, kernel="torch")
    assert torch.allclose(contiguous, paged, atol=1e-5)


def test_one_draw_serves_every_block_size():
    """The pools are drawn once per length and viewed in blocks of each size: every case reads the
    same values, in its own shuffled order, and the contiguous copy is that order's gather."""
    pools = overhead.random_pools(32, SIZES, seed=5, device="cpu")
    for block_size in (4, 8, 16):
        q, k_cache, v_cache, tables, seq_lens, k, v = overhead.timing_case(
            32, block_size, SIZES, seed=block_size, device="cpu", pools=pools
        )
        assert k_cache.data_ptr() == pools[1].data_ptr() and v_cache.data_ptr() == pools[2].data_ptr()
        assert k_cache.shape == (
            SIZES.batch * 32 // block_size,
            block_size,
            SIZES.num_kv_heads,
            SIZES.head_dim,
        )
        first = k_cache[tables[0, 0]]  # sequence 0's first block, wherever it lies
        assert torch.equal(k[0, :block_size], first)
        assert torch.equal(q, pools[0])
    assert len(overhead.timing_case(32, 8, SIZES, device="cpu", pools=pools, contiguous=False)) == 5


def test_bench_fields(monkeypatch):
    monkeypatch.setattr(overhead, "kernel_sizes", lambda device: SIZES)
    monkeypatch.setattr(overhead, "tokens_identical", lambda: True)
    fields = overhead.bench()
    assert set(fields) == {
        "kernel",
        "paged_kernel_overhead",
        "paged_gather_kernel_overhead",
        "paged_tokens_identical",
    }
    assert fields["kernel"] in KERNELS
    assert fields["paged_kernel_overhead"] > 0 and fields["paged_gather_kernel_overhead"] > 0
