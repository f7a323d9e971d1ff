import os
import platform
import time

import pytest
import torch

from kvlib import KVLibError, units
from kvlib.measure import hardware, probes, timing
from kvlib.measure.hardware import hardware_report
from kvlib.measure.probes import memory_bandwidth
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


def test_hardware_report_has_every_field():
    report = hardware_report()
    assert report.num_cpus >= 1 and report.ram_bytes > 0 and report.torch_threads >= 1
    assert report.torch == torch.__version__
    banner = report.banner()
    assert banner.count("\n") == 4
    assert f"LLC {hardware._fmt_bytes(report.caches.llc_bytes)}" in banner
    for word in ("CPU", "Cache", "GPU", "OS", "Python", "torch", "BLAS", "cores", "threads"):
        assert word in banner
    assert (report.gpu_name is None) == (not torch.cuda.is_available())


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


# ---- hardware facts: read, never assumed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("536870912", 512 << 20),
        ("512MiB", 512 << 20),
        ("512M", 512 << 20),
        ("32K", 32 << 10),
        ("1GiB", 1 << 30),
        (" 2 g ", 2 << 30),
    ],
)
def test_parse_bytes(text, expected):
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-5", "0", "1.5GiB", "12TB"])
def test_parse_bytes_rejects_nonsense_in_one_line(text):
    with pytest.raises(KVLibError, match="KVBOOK_LLC_BYTES must be a positive size"):
        units.parse_bytes(text, "KVBOOK_LLC_BYTES")


def _fake_sysfs(root, caches_per_cpu):
    """cpuN/cache/indexM/{level,type,size,shared_cpu_list} as Linux lays them out."""
    for cpu, caches in enumerate(caches_per_cpu):
        for index, (level, kind, size, shared) in enumerate(caches):
            d = root / f"cpu{cpu}" / "cache" / f"index{index}"
            d.mkdir(parents=True)
            for name, value in (
                ("level", level),
                ("type", kind),
                ("size", size),
                ("shared_cpu_list", shared),
            ):
                (d / name).write_text(f"{value}\n")
    (root / "cpufreq").mkdir()  # not a CPU: ignored


def test_sysfs_counts_each_shared_cache_once_and_sums_instances(tmp_path):
    # two chiplets of two CPUs: an L2 per CPU, an L3 per chiplet (as on an AMD EPYC)
    cpus = [
        [
            (1, "Data", "32K", str(c)),
            (1, "Instruction", "32K", str(c)),
            (2, "Unified", "1024K", str(c)),
            (3, "Unified", "32768K", "0-1" if c < 2 else "2-3"),
        ]
        for c in range(4)
    ]
    _fake_sysfs(tmp_path, cpus)
    levels = {(c.level, c.kind): c for c in hardware._sysfs_caches(str(tmp_path))}
    assert levels[(2, "Unified")].num_instances == 4 and levels[(2, "Unified")].size_bytes == 1 << 20
    assert levels[(3, "Unified")].num_instances == 2 and levels[(3, "Unified")].total_bytes == 64 << 20


def test_cache_info_reads_sysfs_and_the_override_replaces_it(monkeypatch, tmp_path):
    _fake_sysfs(tmp_path, [[(2, "Unified", "2048K", "0"), (3, "Unified", "491520K", "0")]])  # a 480 MiB Xeon
    monkeypatch.setattr(hardware, "SYSFS_CPU_ROOT", str(tmp_path))
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.delenv("KVBOOK_LLC_BYTES", raising=False)
    info = hardware.cache_info("cpu")
    assert (info.llc_bytes, info.source) == (480 << 20, "sysfs")
    assert "LLC 480 MiB (sysfs)" in info.describe()
    monkeypatch.setenv("KVBOOK_LLC_BYTES", "1GiB")
    assert (hardware.llc_bytes("cpu"), hardware.cache_info("cpu").source) == (1 << 30, "KVBOOK_LLC_BYTES")
    monkeypatch.setenv("KVBOOK_LLC_BYTES", "big")
    with pytest.raises(KVLibError, match="KVBOOK_LLC_BYTES must be"):
        hardware.llc_bytes("cpu")


def test_cache_info_states_its_fallback(monkeypatch):
    monkeypatch.setattr(hardware, "_sysfs_caches", lambda: ())
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.delenv("KVBOOK_LLC_BYTES", raising=False)
    info = hardware.cache_info("cpu")
    assert info.llc_bytes == hardware.FALLBACK_LLC_BYTES and "assumed" in info.source


def test_macos_sysctl_and_apple_system_cache(monkeypatch):
    values = {"hw.perflevel0.l1dcachesize": 131072, "hw.perflevel0.l2cachesize": 16 << 20}
    monkeypatch.setattr(hardware, "_sysctl_caches", lambda: hardware._levels_from_sysctl(values.get))
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.delenv("KVBOOK_LLC_BYTES", raising=False)
    info = hardware.cache_info("cpu")
    assert info.llc_bytes == (16 << 20) + hardware.APPLE_SLC_BYTES and "system cache assumed" in info.source


@pytest.mark.parametrize("llc_mib", [4, 32, 96, 480, 512, 1024])
def test_every_size_chosen_from_the_hardware_grows_with_the_llc(monkeypatch, llc_mib):
    monkeypatch.setenv("KVBOOK_LLC_BYTES", f"{llc_mib}MiB")
    monkeypatch.setattr(hardware, "available_memory_bytes", lambda device=None: 64 << 30)
    size = hardware.dram_size("cpu")
    assert size.llc_bytes == llc_mib << 20 and not size.bounded
    assert size.num_bytes == max(4 * llc_mib, 64) << 20  # at 512 MiB the probe reads 2 GiB
    assert hardware.dram_size("cpu", multiple=8).num_bytes == max(8 * llc_mib, 64) << 20


def test_dram_size_is_bounded_by_available_memory_and_says_so(monkeypatch):
    monkeypatch.setenv("KVBOOK_LLC_BYTES", "4GiB")
    monkeypatch.setattr(hardware, "available_memory_bytes", lambda device=None: 8 << 30)
    size = hardware.dram_size("cpu")
    assert size.num_bytes == 2 << 30 and size.wanted_bytes == 16 << 30 and size.bounded
    with pytest.raises(KVLibError, match="multiple must be"):
        hardware.dram_size("cpu", multiple=0)


def test_thread_and_core_counts_are_read():
    assert 1 <= hardware.all_threads() <= (os.cpu_count() or 1)
    assert 1 <= hardware.physical_cores() <= (os.cpu_count() or 1)
    assert hardware.available_memory_bytes("cpu") > 0


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


def test_torch_threads_sets_then_restores_the_thread_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):  # None leaves the setting alone (what GPU callers pass)
        assert torch.get_num_threads() == before


# ---- comparing functions: interleaved rounds (chapters 1, 3 and 6)


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
