"""An offload tier below the paged cache's prefix cache (chapter 12): evicted blocks kept in CPU memory and
on disk, loaded back on a prefix hit that missed the device pool instead of being recomputed.

The prefix cache of :class:`~kvlib.paged.block_pool.BlockPool` keeps a freed full block under its
chained hash until the block is taken for new tokens: then its K/V are lost, and a conversation
that returns later prefills its whole history again. LMCache and vLLM's KV connectors (the
``OffloadingConnector``, ``--kv-offloading-backend native``) keep such blocks in larger, slower
memory. Here:

- :class:`CPUTier`: blocks in host memory, bounded in bytes, least recently used dropped first
  (pinned memory when the cache is on a GPU, so that the copy back runs at the link's speed);
- :class:`DiskTier`: blocks as files in a folder (a temporary one by default), bounded in bytes, LRU;
- :class:`TieredStore`: the CPU tier over the disk tier: what the CPU tier drops goes to disk;
- :class:`OffloadingCache`: a :class:`~kvlib.paged.paged_cache.PagedKVCache` with prefix caching and a
  store: before each allocation it saves the cached blocks the allocation is about to evict, and
  after the device pool's hits it loads the next blocks of the prompt from the store, one gathered
  copy for K and one for V, so that the prefill runs only past them.

A block is keyed by the same chained hash the prefix cache uses
(:func:`~kvlib.paged.block_pool.hash_block_tokens`): equal keys mean equal prefixes, so a block
found in the store holds exactly the K/V the prefill would compute. Each block's K and V over all
layers are one entry, shaped ``(num_layers, block_size, num_kv_heads, head_dim)`` each.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kvlib import KVLibError
from kvlib.checks import checked_token_ids, require_int
from kvlib.paged.block_pool import hash_block_tokens
from kvlib.paged.paged_cache import PagedKVCache

Entry = tuple[torch.Tensor, torch.Tensor]  # K and V of one block: (layers, block_size, kv_heads, hd) each


def entry_bytes(entry: Entry) -> int:
    """Bytes of one block's K and V (a one-line KVLibError for what is no (K, V) pair: check_entry)."""
    return sum(t.numel() * t.element_size() for t in check_entry(entry))


MAX_KEY = 128  # characters of a block key: a hash (64 hex digits), short enough to name a file


def _check_key(key) -> str:
    if not isinstance(key, str) or not key.isalnum() or len(key) > MAX_KEY:
        raise KVLibError(
            f"a block key is a block hash (letters and digits, at most {MAX_KEY}), not {key!r}"[:200]
        )
    return key


def check_entry(entry) -> Entry:
    """``entry`` if it is one block's (K, V): two tensors of one shape and dtype that hold values
    (not meta tensors); else a one-line KVLibError. Checked where an entry comes in (``put``)."""
    if (
        not isinstance(entry, tuple | list)
        or len(entry) != 2
        or not all(isinstance(t, torch.Tensor) for t in entry)
    ):
        raise KVLibError(f"an entry is one block's (K, V), two tensors, not {type(entry).__name__}")
    k, v = entry
    if k.shape != v.shape or k.dtype != v.dtype or k.is_meta or v.is_meta:
        meta = " (meta)" if k.is_meta or v.is_meta else ""
        raise KVLibError(
            f"an entry's K and V must be tensors of one shape and dtype that hold values, not "
            f"{tuple(k.shape)} {k.dtype} and {tuple(v.shape)} {v.dtype}{meta}"
        )
    return k, v


class CPUTier:
    """Blocks in host memory, at most ``capacity_bytes`` of them; the least recently used leave first.

    ``pin_memory``: keep the copies page-locked, so that a GPU copies them back by DMA at the link's
    speed; ``None`` (the default) pins the copy of a block that comes from a GPU, and only that.
    """

    name = "cpu"

    def __init__(self, capacity_bytes: int, pin_memory: bool | None = None):
        self.capacity_bytes = require_int(capacity_bytes, "the CPU tier's capacity_bytes", 0)
        if pin_memory is not None and not isinstance(pin_memory, bool):
            raise KVLibError(f"pin_memory must be True, False or None, not {pin_memory!r}"[:200])
        self.pin_memory = pin_memory
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        """The keys held, least recently used first."""
        return list(self._entries)

    def put(self, key: str, entry: Entry) -> list[tuple[str, Entry]]:
        """Keep a copy of ``entry``; returns the entries dropped to make room (oldest first), the new one
        among them if it alone exceeds the capacity."""
        key, size = _check_key(key), entry_bytes(entry)
        if key in self._entries:
            self._entries.move_to_end(key)
            return []
        if size > self.capacity_bytes:
            return [(key, entry)]
        dropped = []
        while self.num_bytes + size > self.capacity_bytes:
            old_key, old = self._entries.popitem(last=False)
            self.num_bytes -= entry_bytes(old)
            dropped.append((old_key, old))
        self._entries[key] = tuple(self._copy(t) for t in entry)
        self.num_bytes += size
        return dropped

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous host copy of ``tensor`` (never a view of the pool: its block will be overwritten)."""
        pin = tensor.device.type == "cuda" if self.pin_memory is None else self.pin_memory
        copy = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
        return copy.copy_(tensor)

    def get(self, key: str) -> Entry | None:
        """The entry under ``key`` (now the most recently used), or ``None``."""
        entry = self._entries.get(_check_key(key))
        if entry is not None:
            self._entries.move_to_end(key)
        return entry


class DiskTier:
    """Blocks as files in ``directory`` (default: a new temporary folder), at most ``capacity_bytes``; LRU.

    Each entry is one file of raw bytes, K then V; shapes and dtype are kept in memory. :meth:`close`
    removes the folder if the tier made it.
    """

    name = "disk"

    def __init__(self, capacity_bytes: int, directory: str | Path | None = None):
        self.capacity_bytes = require_int(capacity_bytes, "the disk tier's capacity_bytes", 0)
        if directory is not None and not isinstance(directory, str | Path):
            raise KVLibError(f"directory must be a path (str or Path) or None, not {directory!r}"[:200])
        self._own_dir = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="kvlib-offload-") if directory is None else directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # not a folder, cannot be made, no permission
            raise KVLibError(f"the disk tier cannot use {str(directory)[:100]!r} ({exc.strerror})") from None
        self._entries: OrderedDict[str, tuple[torch.Size, torch.dtype, int]] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.kv"

    def put(self, key: str, entry: Entry) -> list[str]:
        """Write ``entry`` to its file; returns the keys dropped (deleted) to make room."""
        key, size = _check_key(key), entry_bytes(entry)
        if key in self._entries:
            self._entries.move_to_end(key)
            return []
        if size > self.capacity_bytes:
            return [key]
        dropped = []
        while self.num_bytes + size > self.capacity_bytes:
            old_key, (_, _, old_size) = self._entries.popitem(last=False)
            self._path(old_key).unlink(missing_ok=True)
            self.num_bytes -= old_size
            dropped.append(old_key)
        k, v = entry
        raw = torch.cat([k.reshape(-1), v.reshape(-1)]).cpu().view(torch.uint8).numpy()
        raw.tofile(self._path(key))
        self._entries[key] = (k.shape, k.dtype, size)
        self.num_bytes += size
        return dropped

    def get(self, key: str) -> Entry | None:
        """The entry read back from its file (now the most recently used), or ``None``."""
        meta = self._entries.get(_check_key(key))
        if meta is None:
            return None
        self._entries.move_to_end(key)
        shape, dtype, _ = meta
        flat = torch.from_numpy(np.fromfile(self._path(key), dtype=np.uint8)).view(dtype)
        k, v = flat.chunk(2)
        return k.view(shape), v.view(shape)

    def close(self) -> None:
        """Forget every entry; delete the folder if this tier created it."""
        self._entries.clear()
        self.num_bytes = 0
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class TierCounts:
    """What a :class:`TieredStore` did so far, in blocks."""

    saved: int = 0  # entries put into the CPU tier
    spilled: int = 0  # entries the CPU tier dropped that went to disk
    dropped: int = 0  # entries no tier kept
    cpu_hits: int = 0
    disk_hits: int = 0
    misses: int = 0


class TieredStore:
    """A CPU tier over a disk tier (either may be ``None``): saved blocks go to the CPU tier, what it
    drops goes to disk, what the disk drops is gone. A lookup asks the CPU tier, then the disk."""

    def __init__(self, cpu: CPUTier | None, disk: DiskTier | None = None):
        if cpu is None and disk is None:
            raise KVLibError("a tiered store needs a CPU tier, a disk tier or both")
        if not isinstance(cpu, CPUTier | None) or not isinstance(disk, DiskTier | None):
            raise KVLibError(
                f"a tiered store takes a CPUTier and a DiskTier (or None), not "
                f"{type(cpu).__name__} and {type(disk).__name__}"
            )
        self.cpu, self.disk = cpu, disk
        self.counts = TierCounts()

    def __contains__(self, key: str) -> bool:
        return any(tier is not None and key in tier for tier in (self.cpu, self.disk))

    def put(self, key: str, entry: Entry) -> None:
        """Save one block's K/V."""
        self.counts.saved += 1
        spill = self.cpu.put(key, entry) if self.cpu is not None else [(key, entry)]
        for old_key, old in spill:
            if self.disk is None:
                self.counts.dropped += 1
                continue
            self.counts.spilled += 1
            self.counts.dropped += len(self.disk.put(old_key, old))

    def get(self, key: str) -> tuple[Entry, str] | None:
        """``(entry, tier name)`` of the first tier holding ``key``, or ``None``."""
        for tier in (self.cpu, self.disk):
            entry = None if tier is None else tier.get(key)
            if entry is not None:
                if tier is self.cpu:
                    self.counts.cpu_hits += 1
                else:
                    self.counts.disk_hits += 1
                return entry, tier.name
        self.counts.misses += 1
        return None

    def close(self) -> None:
        """Delete the disk tier's files."""
        if self.disk is not None:
            self.disk.close()


@dataclass(frozen=True)
class TieredAllocation:
    """Where the cached part of a prompt came from (tokens): the device pool, or the store."""

    seq_id: int
    num_device_tokens: int  # leading prompt tokens the device pool's prefix cache held
    num_loaded_tokens: int  # tokens after them whose blocks were copied in from the store
    loaded_from: tuple[str, ...]  # the tier of each loaded block

    @property
    def num_cached_tokens(self) -> int:
        """Leading tokens with K/V before the prefill: it runs the model past them."""
        return self.num_device_tokens + self.num_loaded_tokens


class OffloadingCache:
    """A paged cache with prefix caching, over a :class:`TieredStore` (``None``: plain prefix caching).

    Allocate and append through it (:meth:`allocate`, :meth:`append_slot`) rather than through
    ``cache.manager``: it saves each cached block about to be evicted first. The model runs on
    ``cache`` as usual (:func:`kvlib.paged.decode_loop.prefill`).
    """

    def __init__(self, cache: PagedKVCache, store: TieredStore | None):
        if not isinstance(cache, PagedKVCache) or not cache.manager.enable_prefix_caching:
            raise KVLibError("an offloading cache needs a PagedKVCache with prefix caching on")
        if store is not None and not isinstance(store, TieredStore):
            raise KVLibError(f"store must be a TieredStore or None, not {type(store).__name__}")
        self.cache, self.store = cache, store
        self.manager = cache.manager

    def _save_evicted(self, num_new_blocks: int, keep: Sequence[int] = ()) -> None:
        """Save the cached blocks among the first ``num_new_blocks`` of the free queue (the blocks about to be
        taken), past the ones in ``keep`` (prefix hits, which leave the queue first)."""
        if self.store is None or num_new_blocks <= 0:
            return
        pool, taken = self.manager.pool, 0
        for block_id in pool.free_queue.block_ids():
            if taken == num_new_blocks:
                break
            if block_id in keep:
                continue
            taken += 1
            block_hash = pool.blocks[block_id].block_hash
            if block_hash is not None and block_hash not in self.store:
                self.store.put(block_hash, (self.cache.k[:, block_id], self.cache.v[:, block_id]))

    def allocate(self, seq_id: int, token_ids: Sequence[int]) -> TieredAllocation | None:
        """Blocks for a prompt: the device pool's prefix hits, then blocks loaded from the store for as
        many following full blocks as it holds (never the last prompt token's, which the prefill must
        compute for its logits); ``None`` if the pool is short of blocks."""
        checked_token_ids(token_ids)
        manager, size = self.manager, self.manager.block_size
        hashes, parent = [], None
        for i in range((len(token_ids) - 1) // size):
            parent = hash_block_tokens(parent, token_ids[i * size : (i + 1) * size])
            hashes.append(parent)
        hits = []  # the device pool's prefix hits: consecutive from the first block
        for block_hash in hashes:
            if block_hash not in manager.pool.cached:
                break
            hits.append(manager.pool.cached[block_hash].block_id)
        if manager.can_allocate(token_ids):
            self._save_evicted(manager.num_blocks_for(len(token_ids)) - len(hits), set(hits))
        allocation = manager.allocate(seq_id, token_ids)
        if allocation is None:
            return None
        num_device = allocation.num_cached_tokens
        loaded, tiers = self._load(seq_id, hashes[num_device // size :], num_device // size)
        if loaded:
            manager.mark_computed(seq_id, num_device + len(loaded) * size)
        return TieredAllocation(seq_id, num_device, len(loaded) * size, tuple(tiers))

    def _load(self, seq_id: int, hashes: list[str], first: int) -> tuple[list[int], list[str]]:
        """Copy the store's blocks for ``hashes`` (consecutive, from logical block ``first``) into the
        sequence's blocks until the first miss; returns the blocks written and their tiers."""
        if self.store is None:
            return [], []
        found, tiers = [], []
        for block_hash in hashes:
            hit = self.store.get(block_hash)
            if hit is None:
                break
            found.append(hit[0])
            tiers.append(hit[1])
        if not found:
            return [], []
        table = self.manager.block_table(seq_id)[first : first + len(found)]
        index = torch.tensor(table, device=self.cache.k.device)
        for pool, part in ((self.cache.k, 0), (self.cache.v, 1)):  # one gathered copy each for K and V
            stacked = torch.stack([entry[part] for entry in found], dim=1)  # (layers, n, bs, kv_heads, hd)
            pool.index_copy_(1, index, stacked.to(pool.device, non_blocking=True))
        return table, tiers

    def append_slot(self, seq_id: int) -> int | None:
        """:meth:`BlockManager.append_slot <kvlib.paged.block_manager.BlockManager.append_slot>`, the
        evicted block saved first."""
        manager = self.manager
        table = manager.block_table(seq_id)
        full = manager.num_tokens(seq_id) % manager.block_size == 0
        if full or manager.ref_cnt(table[-1]) > 1:
            self._save_evicted(1)
        return manager.append_slot(seq_id)

    def free(self, seq_id: int) -> None:
        """Free a sequence's blocks (they stay in the device's prefix cache until evicted)."""
        self.manager.free(seq_id)

    def evict(self, seq_id: int) -> None:
        """Free a sequence and evict its blocks from the device's prefix cache now, saving them to the store
        as an eviction would (blocks another sequence still uses stay): the next request with its prefix
        misses the device pool. A measurement serves the same returning request again and again by it."""
        pool = self.manager.pool
        blocks = [pool.blocks[b] for b in self.manager.block_table(seq_id)]
        self.manager.free(seq_id)
        for block in blocks:
            if block.ref_cnt == 0 and block.block_hash is not None:
                if self.store is not None and block.block_hash not in self.store:
                    self.store.put(
                        block.block_hash, (self.cache.k[:, block.block_id], self.cache.v[:, block.block_id])
                    )
                pool.uncache(block)
