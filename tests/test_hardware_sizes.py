"""Every size that a claim of the book depends on is chosen from the hardware:
with a larger last-level cache (KVBOOK_LLC_BYTES) each one grows, and each that must come
from DRAM stays at least four times the cache. One test lists them all, chapter by chapter."""

import pytest

from kvlib.cache.contiguous import kv_bytes_per_token
from kvlib.chapters.ch01_no_cache import nocache_race as nocache
from kvlib.chapters.ch02_cache_size import decode_speed as decode
from kvlib.chapters.ch03_paged_attention import kernel_overhead as paged_measure
from kvlib.measure import hardware
from kvlib.measure.hardware import dram_bytes
from kvlib.units import MiB


def sizes_from_the_hardware() -> dict[str, tuple[int, int]]:
    """name -> (bytes that must come from DRAM, the size chosen) for every hardware-chosen size (CPU)."""
    setup = decode.decode_setup("cpu")
    k_bytes = setup.batch * setup.num_heads * setup.longest * setup.head_dim * 4
    ch1 = nocache.nocache_setup("cpu")
    trap_bytes = ch1.trap_lengths[-1] * ch1.batch * kv_bytes_per_token(ch1.config)  # float32
    kernel = paged_measure.kernel_sizes("cpu")
    return {
        "ch0 and bench: DRAM probe buffer": (dram_bytes("cpu"), dram_bytes("cpu")),
        "ch2 and ch6: MHA's K at the longest decode context": (k_bytes, setup.longest),
        "ch1: concatenation trap's longest cache": (trap_bytes, ch1.trap_lengths[-1]),
        "ch3: paged kernel's longest K+V": (kernel.kv_bytes(kernel.lengths[-1]), kernel.lengths[-1]),
    }


@pytest.fixture
def plenty_of_memory(monkeypatch):
    monkeypatch.setattr(hardware, "available_memory_bytes", lambda device=None: 256 << 30)


def test_every_size_grows_with_the_llc_and_stays_beyond_four_times_it(monkeypatch, plenty_of_memory):
    chosen = {}
    for llc_mib in (32, 512):
        monkeypatch.setenv("KVBOOK_LLC_BYTES", f"{llc_mib}MiB")
        chosen[llc_mib] = sizes_from_the_hardware()
        for name, (dram_size, _) in chosen[llc_mib].items():
            assert dram_size >= 4 * llc_mib * MiB, (llc_mib, name)
    for name in chosen[32]:
        assert chosen[512][name][1] > chosen[32][name][1], name  # 16x the cache: every size grows
    # at 512 MiB the probe reads 2 GiB, as the README says
    assert chosen[512]["ch0 and bench: DRAM probe buffer"][0] == 2 << 30
