import pytest
import torch

from kvlib import KVLibError
from kvlib.measure import Timing, hardware_report, memory_bandwidth, pick_device, time_it, torch_threads


def test_pick_device_defaults_to_what_torch_sees(monkeypatch):
    monkeypatch.delenv("KVBOOK_DEVICE", raising=False)
    assert pick_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_device("cpu").type == "cpu"


def test_pick_device_rejects_unknown_and_missing_devices(monkeypatch):
    with pytest.raises(KVLibError, match="device must be"):
        pick_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KVLibError, match="no CUDA"):
        pick_device("cuda")


def test_time_it_warms_up_then_repeats():
    calls = []
    timing = time_it(lambda: calls.append(1), repeats=4, warmup=2, number=3)
    assert len(calls) == 2 + 4 * 3
    assert len(timing.samples) == 4
    assert timing.min_s <= timing.median_s <= timing.max_s


def test_time_it_reports_the_median_not_the_mean():
    delays = iter([0.0, 0.0, 0.05, 0.0, 0.0])  # one slow repeat among fast ones

    def fn():
        import time

        time.sleep(next(delays))

    timing = time_it(fn, repeats=5, warmup=0)
    assert timing.max_s >= 0.05
    assert timing.median_s < 0.02


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"warmup": -1}, {"number": 0}, {"repeats": 2.5}])
def test_time_it_rejects_bad_counts(kwargs):
    with pytest.raises(KVLibError):
        time_it(lambda: None, **kwargs)


def test_timing_formats_units():
    assert "ms" in str(Timing(0.0025, 0.002, 0.003, (0.002, 0.0025, 0.003)))
    assert Timing(2.0, 1.0, 4.0, (1.0, 2.0, 4.0)).spread == 4.0


def test_hardware_report_has_every_field():
    report = hardware_report()
    assert report.num_cpus >= 1 and report.ram_bytes > 0 and report.torch_threads >= 1
    assert report.torch == torch.__version__
    banner = report.banner()
    assert banner.count("\n") == 3
    for word in ("CPU", "GPU", "OS", "Python", "torch", "BLAS"):
        assert word in banner
    assert (report.gpu_name is None) == (not torch.cuda.is_available())


def test_memory_bandwidth_is_bytes_over_time():
    probe = memory_bandwidth(num_bytes=8 << 20, device="cpu", repeats=3)
    assert probe.num_bytes == 8 << 20
    assert probe.gbps == pytest.approx(probe.num_bytes / probe.timing.median_s / 1e9)
    assert probe.best_gbps >= probe.gbps > 0


@pytest.mark.parametrize("num_bytes", [0, 100, -5, 1.5e6])
def test_memory_bandwidth_rejects_bad_sizes(num_bytes):
    with pytest.raises(KVLibError, match="num_bytes"):
        memory_bandwidth(num_bytes=num_bytes, device="cpu")


def test_torch_threads_sets_then_restores_the_thread_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):  # None leaves the setting alone (what GPU callers pass)
        assert torch.get_num_threads() == before
