"""Tests of kvlib.cache.decode_speed: decode measurements count bytes and FLOPs right;
per-device sizes keep K/V far beyond CPU caches; bench() reports its fields."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache import decode_speed as decode


def test_measurement_counts_bytes_and_flops():
    timing = decode.Timing(0.5, 0.4, 0.6, (0.5,))
    m = decode.DecodeMeasurement("grouped", 8, 1000, 2, 32, 128, 2, timing)
    assert m.kv_bytes == 2 * 2 * 8 * 1000 * 128 * 2
    assert m.flops == 4 * 2 * 32 * 1000 * 128
    assert m.intensity == 2 * (32 // 8) / 2
    assert m.gbps == m.kv_bytes / 0.5 / 1e9 and m.gflops == m.flops / 0.5 / 1e9
    assert m.best_gbps == m.kv_bytes / 0.4 / 1e9


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
    rows = decode.compare_implementations(setup, 4, 64, repeats=1)
    assert [r.impl for r in rows] == ["grouped", "repeat", "sdpa"]
    with pytest.raises(KVLibError, match="num_kv_heads must divide"):
        decode.measure_decode(setup, 3, 64)
    with pytest.raises(KVLibError, match="unknown attention implementation 'flash'"):
        decode.time_decode(setup, *decode.decode_inputs(setup, 8, 64), impl="flash")


def test_bound_breakdown_times_four_reads_of_the_same_bytes():
    setup = decode.DecodeSetup(torch.device("cpu"), torch.float32, batch=1, contexts=(256,), threads=1)
    probe = decode.memory_bandwidth(4 << 20, "cpu", repeats=2, threads=1)
    rows = decode.bound_breakdown(setup, probe, repeats=2)
    assert len(rows) == 4 and {r.bytes_read for r in rows} == {32 * 256 * 128 * 4}
    assert all(r.row()["share of probe"] == r.gbps / probe.best_gbps for r in rows)


def test_inputs_are_seeded():
    setup = decode.DecodeSetup(torch.device("cpu"), torch.float32, batch=1, contexts=(8,))
    a, b = decode.decode_inputs(setup, 4, 8), decode.decode_inputs(setup, 4, 8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_bench_fields(monkeypatch):
    small = decode.DecodeSetup(torch.device("cpu"), torch.float32, batch=1, contexts=(256,), threads=1)
    monkeypatch.setattr(decode, "decode_setup", lambda: small)
    monkeypatch.setattr(
        decode, "probe_bandwidth", lambda setup: decode.memory_bandwidth(4 << 20, "cpu", repeats=2, threads=1)
    )
    fields = decode.bench()
    assert set(fields) == {
        "decode_attn_bw_fraction",
        "gqa8_speedup",
        "mqa_speedup",
        "grouped_vs_repeat_speedup",
    }
    assert all(isinstance(v, float) and v > 0 for v in fields.values())


def test_gpu_sizes_come_from_bandwidth_launch_overhead_and_memory(monkeypatch):
    """The CUDA branch without a GPU: every fact it reads is stubbed with an H100-like value."""
    fake_probe = decode.Bandwidth(
        "cuda", 1 << 30, decode.Timing(0.25e-3, 0.25e-3, 0.3e-3, (0.25e-3,))
    )  # 4.3 TB/s
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
