"""Paged attention in PyTorch and a paged KV cache that ``kvlib.model`` runs on (chapter 3).

The K/V of every layer live in one preallocated pool per layer, shaped
``(num_blocks, block_size, num_kv_heads, head_dim)`` as in vLLM. A
:class:`~kvlib.paged.BlockManager` decides which block holds which token; this module
writes new K/V through the *slot mapping* and reads them back through the *block tables*.

:func:`paged_attention` is the kernel: it gathers each sequence's blocks in block-table
order (one copy of the K/V it reads, which vLLM's CUDA kernel avoids by reading the blocks
in place) and attends with each K/V head shared by its group of query heads, as
:func:`kvlib.attention.grouped_attention` does for the contiguous cache. Chapter 3 checks
that both give the same result and measures what the gather costs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.kernels import GatherBuffer, gather_blocks, key_mask, paged_attention


class PagedKVCache:
    """K/V of every layer in block pools, ``(num_layers, num_blocks, block_size, num_kv_heads, head_dim)``.

    Implements the model's cache protocol for a batch of sequences of different lengths.
    The caller manages sequences through ``cache.manager`` (allocate a prompt, append a
    token, fork, free), chooses the sequences of the next forward pass with
    :meth:`schedule`, and runs the model on their tokens that have no K/V yet:

    - prefill: ``manager.allocate(seq, prompt)``; ``schedule([seq])``; run the prompt after
      the tokens found in the prefix cache;
    - decode: ``manager.append_slot(seq, token)`` for each sequence; ``schedule(seqs)``;
      run one token per sequence.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        device=None,
        dtype=torch.float32,
        enable_prefix_caching: bool = True,
    ):
        self.manager = BlockManager(
            num_blocks, block_size, enable_prefix_caching, copy_block=self._copy_block
        )
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.num_layers = config.num_layers
        self._buffers = (
            GatherBuffer(),
            GatherBuffer(),
            GatherBuffer(),
        )  # K, V, scores: shared by all layers, which run in turn
        self._batch: list[int] = []
        self._step: dict = {}

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    @property
    def num_bytes(self) -> int:
        """Bytes of the K and V pools (all blocks, used or not)."""
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def bytes_per_block(self) -> int:
        return self.num_bytes // self.manager.num_blocks

    def _copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write: copy block ``src``'s K/V into block ``dst`` in every layer."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def schedule(self, seq_ids: Sequence[int]) -> None:
        """Choose the sequences (in batch order) of the next forward pass."""
        if not seq_ids:
            raise KVLibError("schedule needs at least one sequence")
        for seq_id in seq_ids:
            self.manager.block_table(seq_id)  # raises for unknown or freed sequences
        if len(set(seq_ids)) != len(seq_ids):
            raise KVLibError(f"a sequence appears twice in the batch {list(seq_ids)}")
        self._batch = list(seq_ids)

    def prepare(self, num_new: int) -> torch.Tensor:
        """Positions (batch, num_new) of each scheduled sequence's tokens that have no K/V yet."""
        if not self._batch:
            raise KVLibError("no sequences scheduled: call cache.schedule(seq_ids) before running the model")
        if num_new < 1:
            raise KVLibError(f"the model must be given at least one new token per sequence, not {num_new}")
        manager, device = self.manager, self.k.device
        starts, slots = [], []
        for seq_id in self._batch:
            start, length = manager.num_computed(seq_id), manager.num_tokens(seq_id)
            if length - start != num_new:
                raise KVLibError(
                    f"sequence {seq_id} has {length - start} tokens without K/V, but the model was given {num_new}"
                )
            slots += [manager.slot(seq_id, pos) for pos in range(start, length)]
            starts.append(start)
        self._check_private(slots)
        tables = [manager.block_table(s) for s in self._batch]
        width = max(map(len, tables))
        seq_lens = torch.tensor(starts, device=device) + num_new
        self._step = {
            "slot_mapping": torch.tensor(slots, dtype=torch.long, device=device),  # (batch * num_new,)
            "block_tables": torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device),
            "seq_lens": seq_lens,
            "mask": key_mask(
                seq_lens, num_new, self.k.dtype, lengths=[s + num_new for s in starts]
            ),  # for every layer
        }
        return torch.tensor(starts, device=device)[:, None] + torch.arange(num_new, device=device)

    def _check_private(self, slots: list[int]) -> None:
        """Invariant: the slots about to be written belong to blocks no other sequence uses."""
        for slot in slots:
            if self.manager.ref_cnt(slot // self.block_size) != 1:
                raise KVLibError(f"slot {slot} is in a shared block; writing it would change other sequences")

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write this layer's new K/V into their slots, then attend through the block tables."""
        step = self._step
        num_kv_heads, head_dim = k.shape[1], k.shape[3]
        flat = (
            -1,
            num_kv_heads,
            head_dim,
        )  # the pool as one row per slot: (num_blocks * block_size, kv_heads, head_dim)
        self.k[layer].view(flat)[step["slot_mapping"]] = k.transpose(1, 2).reshape(flat)
        self.v[layer].view(flat)[step["slot_mapping"]] = v.transpose(1, 2).reshape(flat)
        out = paged_attention(
            q,
            self.k[layer],
            self.v[layer],
            step["block_tables"],
            step["seq_lens"],
            self._buffers,
            step["mask"],
        )
        if layer == self.num_layers - 1:  # the forward pass is complete: these K/V now exist
            for seq_id in self._batch:
                self.manager.mark_computed(seq_id)
        return out

    def read(self, seq_id: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored K and V of one sequence in one layer, each (num_kv_heads, seq_len, head_dim)."""
        table = torch.tensor(self.manager.block_table(seq_id), device=self.k.device)[None]
        length = self.manager.num_computed(seq_id)
        k, v = gather_blocks(self.k[layer], table), gather_blocks(self.v[layer], table)
        return k[0, :length].transpose(0, 1), v[0, :length].transpose(0, 1)
