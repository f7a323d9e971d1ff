"""The offload tier of chapter 12: bounded LRU tiers, spilling from CPU to disk, saving on eviction,
loading on a prefix hit that missed the device pool, and K/V (so logits) identical to a recompute."""

from __future__ import annotations

import pytest
import torch

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import prefill
from kvlib.paged.offload_tier import CPUTier, DiskTier, OffloadingCache, TieredStore, entry_bytes
from kvlib.paged.paged_cache import PagedKVCache

CONFIG = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1, d_ff=64)


def entry(value: float, shape=(2, 4, 1, 16)):
    return torch.full(shape, float(value)), torch.full(shape, -float(value))


ENTRY_BYTES = entry_bytes(entry(0.0))  # 2 x 128 floats x 4 bytes = 1,024


def test_entry_bytes_counts_k_and_v():
    assert ENTRY_BYTES == 2 * 2 * 4 * 16 * 4


def test_cpu_tier_drops_the_least_recently_used_when_full():
    tier = CPUTier(3 * ENTRY_BYTES)
    for i, key in enumerate("abc"):
        assert tier.put(key, entry(i)) == []
    assert tier.get("a") is not None  # a is now the most recently used
    dropped = tier.put("d", entry(3))
    assert [k for k, _ in dropped] == ["b"] and tier.keys() == ["c", "a", "d"]
    assert tier.num_bytes == 3 * ENTRY_BYTES and tier.get("b") is None


def test_cpu_tier_keeps_a_copy_not_a_view_of_the_pool():
    pool = torch.zeros(1, 3, 4, 1, 16)  # one layer: pool[:, 1] is contiguous, a view would alias it
    tier = CPUTier(10 * ENTRY_BYTES)
    tier.put("a", (pool[:, 1], pool[:, 1]))
    pool.fill_(7.0)
    assert tier.get("a")[0].abs().sum() == 0


def test_an_entry_larger_than_a_tier_is_not_kept():
    tier = CPUTier(ENTRY_BYTES - 1)
    assert [k for k, _ in tier.put("a", entry(1))] == ["a"] and len(tier) == 0


def test_disk_tier_round_trips_bytes_and_deletes_its_files(tmp_path):
    tier = DiskTier(2 * ENTRY_BYTES, tmp_path / "tier")
    k, v = entry(1.5)
    tier.put("a", (k, v))
    back = tier.get("a")
    assert torch.equal(back[0], k) and torch.equal(back[1], v)
    tier.put("b", entry(2))
    assert tier.put("c", entry(3)) == ["a"] and not (tmp_path / "tier" / "a.kv").exists()
    assert sorted(p.name for p in (tmp_path / "tier").iterdir()) == ["b.kv", "c.kv"]
    own = DiskTier(ENTRY_BYTES)
    own.put("x", entry(1))
    own.close()
    assert not own.directory.exists()


def test_the_store_spills_from_cpu_to_disk_and_counts():
    store = TieredStore(CPUTier(2 * ENTRY_BYTES), DiskTier(ENTRY_BYTES))
    for i, key in enumerate("abcd"):
        store.put(key, entry(i))
    # a spilled to disk when c came, then b spilled and pushed a out of the disk
    assert store.counts.saved == 4 and store.counts.spilled == 2 and store.counts.dropped == 1
    assert "a" not in store and store.get("b")[1] == "disk" and store.get("d")[1] == "cpu"
    assert store.get("a") is None and store.counts.misses == 1
    store.close()


@pytest.mark.parametrize("bad", ["../x", "", 3])
def test_keys_are_block_hashes(bad):
    with pytest.raises(KVLibError, match="block key"):
        CPUTier(ENTRY_BYTES).put(bad, entry(1))


def test_a_store_needs_a_tier_and_the_cache_needs_prefix_caching():
    with pytest.raises(KVLibError, match="needs a CPU tier"):
        TieredStore(None, None)
    with pytest.raises(KVLibError, match="prefix caching"):
        OffloadingCache(PagedKVCache(CONFIG, 4, 4, enable_prefix_caching=False), None)
    with pytest.raises(KVLibError, match="capacity_bytes"):
        CPUTier(-1)


def returning(store):
    """A prompt of 40 tokens (blocks of 4) prefilled, then evicted by another of 40 in a pool of 12
    blocks, then back: returns its logits both times, and where its cached part came from."""
    torch.manual_seed(0)
    model = TinyLlama(CONFIG).eval()
    cache = PagedKVCache.for_model(model, 12, 4)
    offload = OffloadingCache(cache, store)
    prompt, other = list(range(1, 41)), list(range(41, 64)) + list(range(1, 18))[::-1]
    first = offload.allocate(0, prompt)
    logits = prefill(model, cache, 0, prompt, first.num_cached_tokens)
    offload.free(0)
    offload.allocate(1, other)
    prefill(model, cache, 1, other, 0)
    offload.free(1)
    back = offload.allocate(2, prompt)
    return logits, prefill(model, cache, 2, prompt, back.num_cached_tokens), back


def test_a_returning_prompt_loads_its_evicted_blocks_and_computes_the_same_logits():
    store = TieredStore(CPUTier(4 * 2 * 2 * 4 * 16 * 4), DiskTier(1 << 20))  # 4 blocks in the CPU tier
    logits, again, back = returning(store)
    # 9 full blocks before the last token; the other prompt evicted 10 blocks, 2 of them left on device
    assert back.num_cached_tokens == 36
    # all from disk: the returning allocation first saved the other prompt's blocks it evicts, and the
    # CPU tier (4 blocks) keeps the newest
    assert back.num_loaded_tokens == 28 and back.loaded_from == ("disk",) * 7
    # the same K/V: the logits differ only by the rounding of a shorter prefill's matmuls
    assert torch.allclose(logits, again, atol=1e-5) and logits.argmax() == again.argmax()
    store.close()


def test_without_a_store_the_returning_prompt_is_recomputed():
    logits, again, back = returning(None)
    assert back.num_loaded_tokens == 0 and back.num_cached_tokens < 36
    assert torch.allclose(logits, again, atol=1e-5)


def test_evict_saves_and_the_next_request_misses_the_device_pool_but_hits_the_store():
    torch.manual_seed(0)
    model = TinyLlama(CONFIG).eval()
    cache = PagedKVCache.for_model(model, 12, 4)
    store = TieredStore(CPUTier(1 << 20))
    offload = OffloadingCache(cache, store)
    prompt = list(range(1, 21))
    prefill(model, cache, 0, prompt, offload.allocate(0, prompt).num_cached_tokens)
    offload.free(0)
    # 11 new blocks: the 7 never used, then the prompt's, freed tail first: its blocks 4, 3, 2, 1 are saved
    offload.allocate(1, list(range(20, 64)))
    offload.evict(1)
    back = offload.allocate(2, prompt)  # 4 full blocks before the last token: 1 on the device, 3 loaded
    assert (back.num_device_tokens, back.num_loaded_tokens, back.loaded_from) == (4, 12, ("cpu",) * 3)
    offload.evict(2)
    again = offload.allocate(3, prompt)  # evicted, block 0 saved too: the store serves all 4
    assert (again.num_device_tokens, again.num_loaded_tokens) == (0, 16)


def test_append_slot_saves_the_cached_block_it_takes():
    torch.manual_seed(0)
    model = TinyLlama(CONFIG).eval()
    cache = PagedKVCache.for_model(model, 2, 4)
    store = TieredStore(CPUTier(1 << 20))
    offload = OffloadingCache(cache, store)
    first = [1, 2, 3, 4]
    prefill(model, cache, 0, first, offload.allocate(0, first).num_cached_tokens)
    offload.free(0)  # its one full block stays cached in the pool, behind the never-used block
    second = [5, 6, 7, 8]
    prefill(model, cache, 1, second, offload.allocate(1, second).num_cached_tokens)
    assert store.counts.saved == 0  # the allocation took the never-used block
    second.append(9)
    assert offload.append_slot(1) is not None  # the second's block is full: the first's is taken, saved first
    assert store.counts.saved == 1 and len(store.cpu) == 1
