"""Tests of kvlib.measure.hardware: caches from sysfs and sysctl, the override, DRAM sizes, the banner."""

import os
import platform

import pytest
import torch

from kvlib import KVLibError
from kvlib.measure import hardware
from kvlib.measure.hardware import hardware_report


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


def test_the_private_cache_is_the_largest_level_below_the_shared_last_level():
    def info(*levels):
        return hardware.CacheInfo(tuple(hardware.CacheLevel(*level) for level in levels), 1, "test")

    xeon = info(
        (1, "Data", 48 << 10, 2),
        (1, "Instruction", 64 << 10, 2),
        (2, "Unified", 2 << 20, 2),
        (3, "Unified", 480 << 20, 1),
    )
    assert xeon.private_cache_bytes == 2 << 20  # the core's own L2, not the 480 MiB L3 the tenants share
    apple = info((1, "Data", 128 << 10, 1), (2, "Unified", 16 << 20, 1))
    assert apple.private_cache_bytes == 128 << 10
    assert info((2, "Unified", 40 << 20, 1)).private_cache_bytes == 40 << 20  # a GPU: only its L2
    assert info().private_cache_bytes is None


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
