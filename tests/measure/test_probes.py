"""Tests of kvlib.measure.probes: the bandwidth, matmul and bench probes."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.measure import hardware, probes
from kvlib.measure.probes import memory_bandwidth


def test_memory_bandwidth_is_bytes_over_time_at_the_thread_count_asked():
    before = torch.get_num_threads()
    probe = memory_bandwidth(num_bytes=8 << 20, device="cpu", repeats=3, threads=1)
    assert probe.num_bytes == 8 << 20 and probe.threads == 1
    assert probe.gbps == pytest.approx(probe.num_bytes / probe.timing.median_s / 1e9)
    assert probe.best_gbps == pytest.approx(probe.num_bytes / probe.timing.min_s / 1e9)
    assert memory_bandwidth(num_bytes=8 << 20, device="cpu", repeats=1).threads == hardware.all_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(KVLibError, match="threads must be"):
        memory_bandwidth(num_bytes=8 << 20, device="cpu", threads=0)


def test_memory_bandwidth_defaults_to_a_buffer_from_dram(monkeypatch):
    monkeypatch.setenv("KVBOOK_LLC_BYTES", "4MiB")
    assert (
        memory_bandwidth(device="cpu", repeats=1).num_bytes == hardware.dram_bytes("cpu") == 64 << 20
    )  # the floor


def test_matmul_probe_counts_two_flops_per_multiply_add():
    compute = probes.matmul_gflops("cpu", threads=1, size=64, repeats=2)
    assert compute.flops == 2 * 64**3 and compute.threads == 1 and compute.dtype == "float32"
    assert compute.gflops == pytest.approx(compute.flops / compute.timing.median_s / 1e9)
    with pytest.raises(KVLibError, match="size must be"):
        probes.matmul_gflops("cpu", size=3)


def test_bench_reports_the_six_hardware_fields(monkeypatch):
    monkeypatch.setenv("KVBOOK_LLC_BYTES", "1MiB")
    monkeypatch.setattr(hardware, "DRAM_FLOOR_BYTES", {"cpu": 4 << 20, "cuda": 1 << 30})
    fields = probes.bench()
    assert {
        "llc_bytes",
        "mem_probe_bytes",
        "mem_bandwidth_gbps",
        "mem_bandwidth_1thread_gbps",
        "matmul_gflops",
        "matmul_1thread_gflops",
    } <= set(fields)
    assert fields["llc_bytes"] == 1 << 20 and fields["mem_probe_bytes"] == 4 << 20


@pytest.mark.parametrize("num_bytes", [0, 100, -5, 1.5e6])
def test_memory_bandwidth_rejects_bad_sizes(num_bytes):
    with pytest.raises(KVLibError, match="num_bytes"):
        memory_bandwidth(num_bytes=num_bytes, device="cpu")
