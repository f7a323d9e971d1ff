"""Tests of kvlib.chapters.ch01_no_cache.concat_trap: the trap's lengths reach DRAM, filled caches, both
caches timed.
"""

from itertools import pairwise

import pytest

import kvlib.chapters.ch01_no_cache.nocache_race as nocache
from kvlib import KVLibError
from kvlib.cache.contiguous import kv_bytes_per_token
from kvlib.chapters.ch01_no_cache.concat_trap import concat_trap, filled_cache, trap_lengths
from kvlib.chapters.ch01_no_cache.nocache_race import nocache_setup
from kvlib.measure.hardware import dram_bytes
from kvlib.model.config import ModelConfig
from tests.single_thread import one_torch_thread  # noqa: F401

TINY = ModelConfig(
    vocab_size=61, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48, max_seq_len=256
)


def test_concat_trap_times_both_caches_and_counts_the_copy():
    points = concat_trap(TINY, batch=2, lengths=(16, 64), repeats=2, number=2)
    assert [p.length for p in points] == [16, 64]
    assert [p.bytes_copied for p in points] == [
        2 * 17 * kv_bytes_per_token(TINY),
        2 * 65 * kv_bytes_per_token(TINY),
    ]
    assert all(p.preallocated.median_s > 0 and p.ratio > 0 for p in points)


def test_filled_caches_hold_the_tokens_without_copying():
    for kind in ("cache", "concat"):
        cache = filled_cache(kind, TINY, batch=3, length=40, spare=5)
        assert cache.length == 40
    assert cache.bytes_copied == 0 and cache.num_bytes == 3 * 40 * kv_bytes_per_token(TINY)
    with pytest.raises(KVLibError, match="kind"):
        filled_cache("paged", TINY, 1, 4)


@pytest.mark.parametrize("llc", [None, "1MiB", "64MiB"])
def test_trap_lengths_reach_dram_from_the_llc(monkeypatch, llc):
    if llc:
        monkeypatch.setenv("KVBOOK_LLC_BYTES", llc)
    else:
        monkeypatch.delenv("KVBOOK_LLC_BYTES", raising=False)
    per_position = kv_bytes_per_token(nocache.CPU_CONFIG)  # batch 1
    lengths = nocache_setup("cpu").trap_lengths
    assert lengths[0] == 256 and all(b == 4 * a for a, b in pairwise(lengths))
    # the last cache reaches the DRAM size (4x the LLC, at least 64 MiB); the one before does not
    assert lengths[-1] * per_position >= dram_bytes("cpu") > lengths[-2] * per_position
    if llc == "64MiB":
        assert lengths[-1] == 262144  # 512 MiB of 2 KiB positions: the first of 256 x 4^k past 256 MiB
    assert trap_lengths(TINY, 2, "cpu", start=8, factor=2)[-1] * 2 * kv_bytes_per_token(TINY) >= dram_bytes(
        "cpu"
    )
