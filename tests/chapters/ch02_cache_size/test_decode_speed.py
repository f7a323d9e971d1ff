"""Tests of kvlib.chapters.ch02_cache_size.decode_speed and decode_roofline: decode measurements count bytes
and FLOPs
right; per-device sizes keep K/V far beyond CPU caches; the roofline fractions, ridge point and
split-K are the stated arithmetic on the timings; bench() reports its fields. Nothing is timed."""

from dataclasses import replace

import pytest
import torch

from kvlib import KVLibError
from kvlib.chapters.ch02_cache_size import decode_roofline as roofline
from kvlib.chapters.ch02_cache_size import decode_speed as decode
from kvlib.measure.hardware import all_threads
from kvlib.measure.probes import Bandwidth
from kvlib.measure.timing import Timing


def test_measurement_counts_bytes_and_flops():
    timing = Timing(0.5, 0.4, 0.6, (0.5,))
    m = decode.DecodeMeasurement("grouped", 8, 1000, 2, 32, 128, 2, timing)
    assert m.kv_bytes == 2 * 2 * 8 * 1000 * 128 * 2
    assert m.flops == 4 * 2 * 32 * 1000 * 128
    assert m.intensity == 2 * (32 // 8) / 2
    assert m.gbps == m.kv_bytes / 0.5 / 1e9 and m.gflops == m.flops / 0.5 / 1e9
    assert m.best_gbps == m.kv_bytes / 0.4 / 1e9
    # timed without the probes (PyTorch's attention): no roofline columns, and no fraction to give
    assert list(m.row()) == [
        "impl",
        "kv heads",
        "context",
        "K+V MiB",
        "time ms",
        "GB/s",
        "GFLOP/s",
        "FLOP/byte",
    ]
    with pytest.raises(KVLibError, match="grouped was timed without the probes"):
        m.bw_fraction  # noqa: B018


def test_per_device_sizes_come_from_the_last_level_cache(monkeypatch):
    for llc_mib, longest in ((8, 16384), (32, 16384), (256, 65536), (512, 131072), (480, 131072)):
        monkeypatch.setenv("KVBOOK_LLC_BYTES", f"{llc_mib}MiB")
        cpu = decode.decode_setup("cpu")
        assert cpu.dtype == torch.float32 and cpu.threads == 1 and cpu.kv_heads == (32, 8, 4, 1)
        assert cpu.contexts == (longest // 16, longest // 4, longest), llc_mib
        k_bytes = cpu.batch * 32 * cpu.longest * cpu.head_dim * 4  # MHA's K alone (V the same)
        assert k_bytes >= 4 * llc_mib * 2**20  # each read from DRAM
        assert (
            k_bytes < 8 * llc_mib * 2**20 or cpu.longest == decode.DECODE_MIN_LONGEST["cpu"]
        )  # the shortest such


def test_longest_context_is_the_shortest_power_of_two_that_holds_the_bytes():
    assert decode.longest_context(32768, 128 << 20, 16384) == 16384  # 4,096 tokens would do; the floor wins
    assert decode.longest_context(32768, 4 << 30, 16384) == 131072
    assert decode.longest_context(1000, 10**6 + 1, 1) == 1024  # 1,001 tokens, rounded up
    with pytest.raises(KVLibError, match="positive"):
        decode.longest_context(0, 1, 1)


def test_measure_decode_on_a_small_setup():
    setup = decode.DecodeSetup(torch.device("cpu"), torch.float32, batch=1, contexts=(64,), threads=1)
    before = torch.get_num_threads()
    m = decode.measure_decode(setup, 8, 64, repeats=2)
    assert m.timing.median_s > 0 and m.kv_bytes == 2 * 8 * 64 * 128 * 4
    assert torch.get_num_threads() == before
    rows = decode.compare_implementations(setup, 4, 64, repeats=3)
    assert [r.impl for r in rows] == ["grouped", "repeat", "sdpa"]
    # timed in the same rounds, on the same cache
    assert all(len(r.timing.samples) == 3 and r.kv_bytes == 2 * 4 * 64 * 128 * 4 for r in rows)
    with pytest.raises(KVLibError, match="num_kv_heads must divide"):
        decode.measure_decode(setup, 3, 64)
    with pytest.raises(KVLibError, match="unknown attention implementation 'flash'"):
        decode.time_decode(setup, *decode.decode_inputs(setup, 8, 64), impl="flash")


def test_inputs_are_seeded():
    setup = decode.DecodeSetup(torch.device("cpu"), torch.float32, batch=1, contexts=(8,))
    a, b = decode.decode_inputs(setup, 4, 8), decode.decode_inputs(setup, 4, 8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _small_kernel_setup(kernel="torch"):
    return decode.DecodeSetup(
        torch.device("cpu"),
        torch.float32,
        batch=1,
        contexts=(64,),
        kv_heads=(8, 2, 1),
        num_heads=8,
        head_dim=16,
        threads=1,
        kernel=kernel,
    )


def _small_probes(setup):
    return roofline.RoofProbes(torch.ones(1 << 16), torch.ones(32, 32))


def test_bench_fields(monkeypatch):
    small = decode.DecodeSetup(torch.device("cpu"), torch.float32, batch=1, contexts=(256,), threads=1)
    monkeypatch.setattr(decode, "decode_setup", lambda: small)
    monkeypatch.setattr(
        decode, "kernel_setup", lambda: replace(small, kernel="torch", kv_heads=(32, 8, 4, 1))
    )
    monkeypatch.setattr(decode, "roof_probes", _small_probes)
    fields = decode.bench()
    assert set(fields) == {
        "kernel",
        "decode_attn_bw_fraction",
        "decode_roofline_fraction",
        "split_k_speedup_mqa",
        "gqa8_speedup",
        "mqa_speedup",
        "grouped_vs_repeat_speedup",
    }
    assert fields["kernel"] == "torch" and set(fields["decode_roofline_fraction"]) == {"32", "8", "4", "1"}
    numbers = [v for k, v in fields.items() if k not in ("kernel", "decode_roofline_fraction")]
    assert all(
        isinstance(v, float) and v > 0 for v in [*numbers, *fields["decode_roofline_fraction"].values()]
    )


def test_kernel_setup_runs_the_default_kernel_on_all_threads():
    setup = decode.kernel_setup("cpu")
    assert setup.threads == all_threads() and setup.kernel == decode.default_kernel("cpu")
    assert setup.contexts == decode.decode_setup("cpu").contexts and "kernel" in setup.describe()


def test_kernel_inputs_are_contiguous_blocks_behind_an_identity_table():
    setup = replace(_small_kernel_setup(), batch=2)
    inputs = roofline.kernel_inputs(setup, 2, 64)
    assert inputs.q.shape == (2, 8, 16) and inputs.k_cache.shape == (8, 16, 2, 16)
    assert inputs.block_tables.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and inputs.seq_lens.tolist() == [
        64,
        64,
    ]
    again = roofline.kernel_inputs(setup, 2, 64)
    assert torch.equal(inputs.k_cache, again.k_cache) and torch.equal(inputs.q, again.q)  # seeded
    with pytest.raises(KVLibError, match="multiple of 16"):
        roofline.kernel_inputs(setup, 2, 60)
    with pytest.raises(KVLibError, match="must divide"):
        roofline.kernel_inputs(setup, 3, 64)


def test_roofline_fractions_are_round_medians_of_the_bound_over_the_time():
    def timing(*samples):
        return Timing(sorted(samples)[1], min(samples), max(samples), samples)

    # 1 KV head of 16 x 64 tokens x 4 B x 2 = 8 KiB; 4 x 8 heads x 64 x 16 = 32,768 FLOPs
    m = roofline.DecodeMeasurement(
        "torch", 1, 64, 1, 8, 16, 4, num_splits=1,
        timing=timing(2.0, 4.0, 8.0), probe=timing(1.0, 1.0, 1.0), probe_bytes=8192,
        matmul=timing(1.0, 3.0, 1.0), matmul_flops=32768,
    )  # fmt: skip
    assert m.kv_bytes == 8192 and m.flops == 32768 and m.intensity == 4.0
    assert m.bw_fraction == 0.25  # rounds: 1/2, 1/4, 1/8 of the probe's rate
    assert m.roofline_fraction == 0.5  # bound per round: max(1, 1), max(1, 3), max(1, 1) over 2, 4, 8
    assert set(m.row()) >= {"of DRAM probe", "of roofline", "splits"}


def test_ridge_point_and_the_group_that_crosses_it():
    assert roofline.ridge_point(200.0, 25.0) == 8.0  # FLOPs per byte where the roofs meet
    assert roofline.crossing_group(8.0, 4) == 16.0  # fp32: intensity 2 x group / 4 = 8 at group 16
    assert roofline.crossing_group(8.0, 2) == 8.0  # fp16 reaches it at half the group
    with pytest.raises(KVLibError, match="positive"):
        roofline.ridge_point(0.0, 1.0)
    with pytest.raises(KVLibError, match="positive"):
        roofline.crossing_group(1.0, 0)


def test_time_kernel_and_split_k_on_a_small_setup():
    setup = _small_kernel_setup()
    rows = roofline.kernel_sweep(setup, _small_probes(setup), rounds=1)
    assert [(m.num_kv_heads, m.context) for m in rows] == [(8, 64), (2, 64), (1, 64)]
    forced = roofline.time_kernel(
        setup, roofline.kernel_inputs(setup, 2, 64), _small_probes(setup), 3, rounds=1
    )
    assert forced.num_splits == 3 and forced.impl == "torch" and len(forced.timing.samples) == 1
    split = roofline.split_k_speedup(setup, rounds=1)
    assert split.num_splits >= 1 and split.speedup == split.one.min_s / split.split.min_s
    # of the output's largest value: the merge is exact but for rounding
    assert roofline.split_k_error(setup) < 1e-5


def test_split_k_error_is_relative_to_the_output(monkeypatch):
    outputs = iter([torch.tensor([0.5, -2.0]), torch.tensor([0.5, -1.0])])
    monkeypatch.setattr(roofline, "decode_attention", lambda *args, **kwargs: next(outputs))
    # a difference of 1 where the output reaches 2
    assert roofline.split_k_error(_small_kernel_setup()) == 0.5


def test_counted_flops_are_pytorchs_count_of_the_two_products():
    setup = _small_kernel_setup()  # 8 query heads of 16, batch 1
    # q.K^T and weights.V: 2 x (2 x heads x context x head_dim), whatever the KV heads
    for kv in setup.kv_heads:
        assert roofline.counted_flops(setup, kv, 64) == 2 * 2 * 8 * 64 * 16
    m = roofline.DecodeMeasurement("torch", 2, 64, 1, 8, 16, 4, None)
    assert m.flops == roofline.counted_flops(setup, 2, 64)
    assert roofline.counted_flops(replace(setup, batch=3), 1, 10) == 3 * 4 * 8 * 10 * 16
    with pytest.raises(KVLibError, match="must divide"):
        roofline.counted_flops(setup, 3, 64)
    with pytest.raises(KVLibError, match="positive"):
        roofline.counted_flops(setup, 2, 0)


def test_gpu_sizes_come_from_bandwidth_launch_overhead_and_memory(monkeypatch):
    """The CUDA branch without a GPU: every fact it reads is stubbed with an H100-like value."""
    fake_probe = Bandwidth("cuda", 1 << 30, Timing(0.25e-3, 0.25e-3, 0.3e-3, (0.25e-3,)))  # 4.3 TB/s
    monkeypatch.setattr(decode, "launch_overhead_s", lambda device: 5e-6)
    monkeypatch.setattr(decode, "memory_bandwidth", lambda device: fake_probe)
    monkeypatch.setattr(decode, "dram_bytes", lambda device: 1 << 30)
    monkeypatch.setattr(decode, "available_memory_bytes", lambda device: 80 << 30)
    gpu = decode.decode_setup("cuda")
    assert gpu.dtype == torch.float16 and gpu.batch == 8 and gpu.threads is None
    # 100 launches x 5 us x 4.29e12 B/s = 2.1e9 B to read, 128 KiB per token: 16,384 tokens
    assert gpu.contexts == (1024, 4096, 16384)
    monkeypatch.setattr(decode, "available_memory_bytes", lambda device: 4 << 30)  # a small GPU caps it
    assert decode.decode_setup("cuda").longest == 8192  # 1 GiB / 128 KiB


def test_roofline_figure_marks_the_ridge_point():
    from kvlib.plotting.sizing import draw_roofline

    timing = Timing(1e-3, 1e-3, 1e-3, (1e-3,))
    m = roofline.DecodeMeasurement("torch", 1, 64, 1, 8, 16, 4, timing, 1, timing, 8192, timing, 32768)
    fig = draw_roofline([m], probe_gbps=10.0, peak_gflops=80.0)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "ridge point: 8.0 FLOP/byte" in labels
