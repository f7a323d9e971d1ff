"""Tests of kvlib.measure.timing: the one timer, interleaved rounds, the clocks, devices and threads."""

import time

import pytest
import torch

from kvlib import KVLibError
from kvlib.measure import timing
from kvlib.measure.timing import Timing, pick_device, round_median, time_it, torch_threads


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


def test_time_it_divides_each_sample_by_number_and_reports_median_min_max(monkeypatch):
    # a fake clock: the five samples last 3, 9, 6, 30 and 12 ticks of 1 s for number=3 calls
    ticks = iter([0, 3, 10, 19, 20, 26, 30, 60, 70, 82])
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    timing = time_it(lambda: None, repeats=5, warmup=0, number=3)
    assert timing.samples == (1.0, 3.0, 2.0, 10.0, 4.0)
    assert (timing.median_s, timing.min_s, timing.max_s) == (3.0, 1.0, 10.0)
    assert timing.spread == 10.0


def test_time_it_reports_the_median_not_the_mean():
    delays = iter([0.0, 0.0, 0.05, 0.0, 0.0])  # one slow repeat among fast ones

    def fn():
        import time

        time.sleep(next(delays))

    timing = time_it(fn, repeats=5, warmup=0)
    assert timing.max_s >= 0.05
    assert timing.median_s < 0.02


def test_thread_clock_does_not_count_time_the_thread_is_not_running():
    import time

    slept = time_it(lambda: time.sleep(0.02), repeats=3, warmup=0, clock="thread")
    assert slept.max_s < 0.005  # sleeping uses no CPU time
    busy = time_it(lambda: sum(range(200_000)), repeats=3, warmup=0, clock="thread")
    assert busy.min_s > 0
    assert time_it(lambda: time.sleep(0.02), repeats=1, warmup=0).min_s >= 0.019  # the wall clock does


def test_thread_clock_refuses_a_gpu_and_unknown_clocks():
    with pytest.raises(KVLibError, match="cannot time a GPU"):
        time_it(lambda: None, clock="thread", device="cuda")
    with pytest.raises(KVLibError, match="clock must be one of wall, thread"):
        time_it(lambda: None, clock="cpu")


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"warmup": -1}, {"number": 0}, {"repeats": 2.5}])
def test_time_it_rejects_bad_counts(kwargs):
    with pytest.raises(KVLibError):
        time_it(lambda: None, **kwargs)


def test_timing_formats_units():
    assert "ms" in str(Timing(0.0025, 0.002, 0.003, (0.002, 0.0025, 0.003)))
    assert Timing(2.0, 1.0, 4.0, (1.0, 2.0, 4.0)).spread == 4.0


def test_torch_threads_sets_then_restores_the_thread_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):  # None leaves the setting alone (what GPU callers pass)
        assert torch.get_num_threads() == before


def test_time_interleaved_takes_turns_and_keeps_every_sample():
    calls = []
    timings = timing.time_interleaved(
        {name: (lambda name=name: calls.append(name)) for name in "abc"},
        rounds=4,
        number=2,
        warmup=0,
        device="cpu",
    )
    # each round runs every function `number` times; the first to go rotates
    assert calls == [c for order in ("abc", "bca", "cab", "abc") for c in order for _ in range(2)]
    assert all(len(t.samples) == 4 for t in timings.values())
    with pytest.raises(KVLibError, match="rounds"):
        timing.time_interleaved({"a": lambda: None}, rounds=0)
    with pytest.raises(KVLibError, match="number"):
        timing.time_interleaved({"a": lambda: None}, number=-1)
    with pytest.raises(KVLibError, match="at least one"):
        timing.time_interleaved({})


def test_time_interleaved_warms_up_then_sizes_samples_to_the_target():
    calls = []
    timing.time_interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, target_s=0, device="cpu"
    )
    # one warm-up and one sizing call each, then one call per sample (target 0 s), turns rotating
    assert calls == ["a", "b", "a", "b", "a", "b", "b", "a", "a", "b"]


def test_time_interleaved_reads_the_thread_clock_on_one_cpu_thread(monkeypatch):
    clocks = []
    real = timing.read_clock
    monkeypatch.setattr(timing, "read_clock", lambda clock="wall": clocks.append(clock) or real(clock))
    with torch_threads(1):
        timing.time_interleaved({"a": lambda: None}, rounds=1, device="cpu", target_s=0)
    assert clocks and set(clocks) == {"thread"}
    clocks.clear()
    with torch_threads(2):
        timing.time_interleaved({"a": lambda: None}, rounds=1, device="cpu", target_s=0)
    assert clocks and set(clocks) == {"wall"}


def test_round_median_compares_within_rounds():
    def timing(*samples):
        return Timing(sorted(samples)[len(samples) // 2], min(samples), max(samples), samples)

    # round 2 ran 3x slower for both; round 3 hit only the numerator
    paged, contiguous = timing(2.0, 6.0, 9.0), timing(1.0, 3.0, 1.0)
    assert round_median(lambda p, c: p / c, paged, contiguous) == 2.0
    assert paged.min_s / contiguous.min_s == 2.0 and paged.median_s / contiguous.median_s == 6.0
    with pytest.raises(KVLibError, match="same number of rounds"):
        round_median(lambda p, c: p / c, paged, timing(1.0))
