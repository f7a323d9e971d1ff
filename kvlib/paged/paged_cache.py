"""The paged KV cache that ``kvlib.model`` runs on: :class:`PagedKVCache` (chapter 3).

The K/V of every layer live in one preallocated pool per layer, shaped
``(num_blocks, block_size, num_kv_heads, head_dim)`` as in vLLM. A
:class:`~kvlib.paged.block_manager.BlockManager` decides which block holds which token;
this module writes each forward pass's new K/V through the *slot mapping* and reads them
back through the *block tables*: a decode step (one new token per sequence) with the fused
kernel of :func:`kvlib.kernels.decode_attention` (numba on the CPU, called straight through a
:class:`~kvlib.kernels.pool_decoder.PoolDecoder`; Triton on CUDA), a prefill with the gather
kernel :func:`kvlib.kernels.torch_gather.paged_attention`. What one forward pass needs for
that, computed once for all layers, is an :class:`AttentionMetadata`, whose tensors are views
of buffers kept from step to step (:class:`~kvlib.paged.step_inputs.StepInputs`). The decode
loop that drives the cache is in :mod:`kvlib.paged.decode_loop`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import is_int, require_int
from kvlib.kernels.dispatch import decode_attention, default_kernel
from kvlib.kernels.pool_decoder import PoolDecoder, pool_decoder_runs
from kvlib.kernels.shape_checks import check_heads
from kvlib.kernels.torch_gather import GatherBuffer, KeyMask, gather_blocks, key_mask, paged_attention
from kvlib.model.config import ModelConfig
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.step_inputs import StepInputs


def check_model_config(config) -> None:
    """A KVLibError unless ``config`` has the positive integer num_layers, num_kv_heads and head_dim a
    cache is shaped by (a :class:`~kvlib.model.config.ModelConfig`; not None, not a dict)."""
    for name in ("num_layers", "num_kv_heads", "head_dim"):
        value = getattr(config, name, None)
        if not is_int(value) or value < 1:
            raise KVLibError(
                f"config must be a model config (kvlib.model.config.ModelConfig) with a positive {name}, "
                f"not {type(config).__name__}"
            )


def check_cache_arguments(config, device, dtype, enable_prefix_caching) -> None:
    """What :class:`PagedKVCache` is built from, checked before any pool is allocated: a model config
    with positive num_layers, num_kv_heads and head_dim, a floating-point torch dtype, a device torch
    can name, and a bool prefix-caching switch (else a one-line KVLibError naming the argument)."""
    check_model_config(config)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise KVLibError(
            f"dtype must be a floating-point torch dtype (torch.float32 ...), not {dtype!r}"[:200]
        )
    try:
        torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError):
        raise KVLibError(
            f"device must be a torch device such as 'cpu' or 'cuda', not {device!r}"[:200]
        ) from None
    if not isinstance(enable_prefix_caching, bool):
        raise KVLibError(f"enable_prefix_caching must be True or False, not {enable_prefix_caching!r}"[:200])


@dataclass(frozen=True)
class AttentionMetadata:
    """Where one forward pass writes and reads, the same for every layer (vLLM's attention metadata)."""

    slot_mapping: torch.Tensor  # (batch * num_new,) int64: the pool slot of each new token, batch-major
    block_tables: torch.Tensor  # (batch, max_blocks) int64, padded with block 0
    seq_lens: torch.Tensor  # (batch,) tokens per sequence, the new ones included
    mask: KeyMask | None  # keys each query of a prefill sees (bias (batch, num_new, num_keys) or None)
    max_seq_len: int  # the longest of seq_lens, known in Python


class PagedKVCache:
    """K/V of every layer in block pools, ``(num_layers, num_blocks, block_size, num_kv_heads, head_dim)``.

    Implements the model's cache protocol for a batch of sequences of different lengths.
    The caller owns each sequence's token list and manages sequences through
    ``cache.manager`` (allocate a prompt, give a new token a slot, fork, free), chooses the
    sequences of the next forward pass with :meth:`schedule`, and runs the model on their
    tokens that have no K/V yet (:func:`kvlib.paged.decode_loop.prefill` and
    :func:`kvlib.paged.decode_loop.decode_step` do both):

    - prefill: ``manager.allocate(seq, tokens)``; ``schedule([seq])``; run the prompt after
      the tokens found in the prefix cache;
    - decode: ``tokens.append(token)`` and ``manager.append_slot(seq)`` for each sequence;
      ``schedule(seqs)``; run one token per sequence.

    ``decode_kernel`` names the kernel of decode steps (see :data:`kvlib.kernels.KERNELS`);
    None, the default, is the device's (:func:`kvlib.kernels.default_kernel`). Set it on an
    instance, or on the class to change every cache.
    """

    decode_kernel: str | None = None
    reuses_buffers = True  # attend writes k, v into the blocks and takes out= (kvlib.model.config.KVCache)

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        device=None,
        dtype=torch.float32,
        enable_prefix_caching: bool = True,
    ):
        check_cache_arguments(config, device, dtype, enable_prefix_caching)
        self.manager = BlockManager(
            num_blocks, block_size, enable_prefix_caching, copy_block=self._copy_block
        )
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        try:
            self.k = torch.zeros(
                shape, device=device, dtype=dtype
            )  # (layers, blocks, block_size, kv_heads, hd)
            self.v = torch.zeros(shape, device=device, dtype=dtype)
        # too large for the device, no dtype, or a device this torch lacks (AssertionError: no CUDA)
        except (RuntimeError, MemoryError, TypeError, AssertionError) as exc:
            num_bytes = 2 * math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
            raise KVLibError(
                f"cannot allocate the K/V pools of num_blocks {num_blocks:,} x block_size {block_size} "
                f"({num_bytes:,} bytes) on {device or 'cpu'}: {str(exc).splitlines()[0][:80]}"
            ) from None
        self.num_layers = config.num_layers
        self.num_copies = 0  # blocks copied by copy-on-write so far
        # K, V, scores: shared by all layers, which run in turn
        self._buffers = (GatherBuffer(), GatherBuffer(), GatherBuffer())
        self._batch: list[int] = []
        self._partial = False  # may the next pass run only the first of the tokens lacking K/V?
        self._ends: list[int] = []  # per scheduled sequence: its tokens with K/V after the pass
        self._metadata: AttentionMetadata | None = None
        self.inputs = StepInputs(device)  # what each forward pass reads, in buffers kept between passes
        self._decoder = None  # the numba kernel bound to the pools, where it runs (a CPU, numba)
        if pool_decoder_runs(device, dtype):
            self._decoder = PoolDecoder(self.k.unbind(0), self.v.unbind(0))

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        """A paged cache shaped for ``model`` (a :class:`~kvlib.model.llama.TinyLlama`), on its
        device and in its dtype: what every paged generation loop, the engine and its
        calibration start from."""
        weight = getattr(getattr(model, "lm_head", None), "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise KVLibError(
                f"model must be a kvlib model (TinyLlama, LeanLlama), not {type(model).__name__}"
            )
        return cls(model.config, num_blocks, block_size, weight.device, weight.dtype, enable_prefix_caching)

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self.manager.block_size

    @property
    def num_bytes(self) -> int:
        """Bytes of the K and V pools (all blocks, used or not)."""
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def bytes_per_block(self) -> int:
        """Bytes of K and V of one block, over all layers."""
        return self.num_bytes // self.manager.num_blocks

    def _copy_block(self, src: int, dst: int) -> None:
        """Copy-on-write: copy block ``src``'s K/V into block ``dst`` in every layer."""
        self.k[:, dst] = self.k[:, src]  # (layers, block_size, kv_heads, head_dim)
        self.v[:, dst] = self.v[:, src]
        self.num_copies += 1

    def schedule(self, seq_ids: Sequence[int], partial: bool = False) -> None:
        """Choose the sequences (in batch order) of the next forward pass.

        ``partial``: the pass may run fewer tokens than lack K/V, the next ones in order (a chunk
        of a prompt, chapter 8's chunked prefill); only those are marked computed.
        """
        if not isinstance(seq_ids, list | tuple | range):  # a generator has no len, a tensor no truth value
            raise KVLibError(f"seq_ids must be a list of sequence ids, not {type(seq_ids).__name__}")
        if not isinstance(partial, bool):
            raise KVLibError(f"partial must be True or False, not {partial!r}"[:200])
        if not seq_ids:
            raise KVLibError("schedule needs at least one sequence")
        for seq_id in seq_ids:
            self.manager.block_table(seq_id)  # raises for unknown or freed sequences
        if len(set(seq_ids)) != len(seq_ids):
            raise KVLibError(f"a sequence appears twice in the batch {list(seq_ids)}")
        self._batch = list(seq_ids)
        self._partial = partial

    def prepare(self, num_new: int) -> torch.Tensor:
        """Positions (batch, num_new) of each scheduled sequence's tokens that have no K/V yet."""
        if not self._batch:
            raise KVLibError("no sequences scheduled: call cache.schedule(seq_ids) before running the model")
        num_new = require_int(num_new, "num_new (new tokens per sequence)")
        manager = self.manager
        starts, slots = [], []
        for seq_id in self._batch:
            start, length = manager.num_computed(seq_id), manager.num_tokens(seq_id)
            if length - start != num_new and not (self._partial and num_new < length - start):
                raise KVLibError(
                    f"sequence {seq_id} has {length - start} tokens without K/V, "
                    f"but the model was given {num_new}"
                )
            slots += [manager.slot(seq_id, pos) for pos in range(start, start + num_new)]
            starts.append(start)
        self._ends = [start + num_new for start in starts]  # tokens with K/V once the pass is done
        self._check_private(slots)
        tables = [manager.block_table(s) for s in self._batch]
        inputs = self.inputs  # views of buffers kept from step to step: a decode step allocates nothing
        seq_lens = inputs.put("seq_lens", self._ends)  # (batch,)
        self._metadata = AttentionMetadata(
            slot_mapping=inputs.put("slot_mapping", slots),
            block_tables=inputs.put_rows("block_tables", tables, max(map(len, tables))),
            seq_lens=seq_lens,
            mask=None if num_new == 1 else key_mask(seq_lens, num_new, self.k.dtype, lengths=self._ends),
            max_seq_len=max(self._ends),
        )
        positions = [start + i for start in starts for i in range(num_new)]
        return inputs.put("positions", positions).view(len(starts), num_new)  # (batch, num_new)

    def _check_private(self, slots: list[int]) -> None:
        """Invariant: the slots about to be written belong to blocks no other sequence uses."""
        for slot in slots:
            if self.manager.ref_cnt(slot // self.block_size) != 1:
                raise KVLibError(f"slot {slot} is in a shared block; writing it would change other sequences")

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Write this layer's new K/V into their slots, then attend through the block tables.

        q: (batch, num_heads, num_new, head_dim); k, v: (batch, num_kv_heads, num_new, head_dim)
        out: optional float32 tensor of q's shape the numba kernel writes a decode step into
        returns: (batch, num_heads, num_new, head_dim)
        """
        self._check_attend(layer, q, k, v, out)
        metadata = self._metadata
        num_kv_heads, head_dim = k.shape[1], k.shape[3]
        flat = (-1, num_kv_heads, head_dim)  # one row per slot: (num_blocks * block_size, kv_heads, hd)
        # (batch, kv_heads, new, hd) -> (batch, new, kv_heads, hd) -> (batch * new, kv_heads, hd), batch-major
        self.k[layer].view(flat)[metadata.slot_mapping] = k.transpose(1, 2).reshape(flat)
        self.v[layer].view(flat)[metadata.slot_mapping] = v.transpose(1, 2).reshape(flat)
        if q.shape[2] == 1 and self._runs_pool_decoder(q):  # the fused kernel, called directly
            out = self._decoder.attend(
                layer, q, metadata.block_tables, metadata.seq_lens, metadata.max_seq_len, out
            )  # (batch, num_heads, 1, head_dim)
        elif q.shape[2] == 1:  # a decode step: the fused kernel reads the blocks in place
            out = decode_attention(
                q[:, :, 0],  # (batch, num_heads, head_dim)
                self.k[layer],  # (num_blocks, block_size, kv_heads, head_dim)
                self.v[layer],
                metadata.block_tables,
                metadata.seq_lens,
                kernel=self.decode_kernel,
                out=None if out is None else out[:, :, 0],
            )[:, :, None]  # (batch, num_heads, 1, head_dim)
        else:  # a prefill: gather, then attend
            out = paged_attention(
                q,
                self.k[layer],
                self.v[layer],
                metadata.block_tables,
                metadata.seq_lens,
                self._buffers,
                metadata.mask,
            )  # (batch, num_heads, num_new, head_dim)
        if layer == self.num_layers - 1:  # the forward pass is complete: these K/V now exist
            for seq_id, end in zip(self._batch, self._ends, strict=True):
                self.manager.mark_computed(seq_id, end)
        return out

    def _check_attend(self, layer, q, k, v, out) -> None:
        """The arguments of :meth:`attend`, checked once per layer before any kernel trusts them: a
        prepared pass, a layer that exists, q, k and v shaped for the scheduled batch and the cache's
        heads, in the cache's dtype and on its device (else a KVLibError)."""
        metadata = self._metadata
        if metadata is None:
            raise KVLibError(
                "attend before prepare: call cache.schedule(seq_ids), then cache.prepare(num_new)"
            )
        require_int(layer, "layer", 0, self.num_layers - 1)
        tensors = {"q": q, "k": k, "v": v} if out is None else {"q": q, "k": k, "v": v, "out": out}
        for name, tensor in tensors.items():
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
                shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise KVLibError(
                    f"{name} must be a 4-d tensor (batch, heads, num_new, head_dim), not {shape}"
                )
        batch, num_new = len(self._batch), metadata.slot_mapping.shape[0] // len(self._batch)
        kv_shape = (batch, self.k.shape[3], num_new, self.k.shape[4])  # (batch, kv_heads, new, hd)
        for name, tensor in (("k", k), ("v", v)):
            if tuple(tensor.shape) != kv_shape:
                raise KVLibError(
                    f"{name} must be (batch, num_kv_heads, num_new, head_dim) = {kv_shape} for the "
                    f"prepared pass, not {tuple(tensor.shape)}"
                )
        if q.shape[0] != batch or q.shape[2] != num_new:
            raise KVLibError(f"q must be ({batch}, num_heads, {num_new}, head_dim), not {tuple(q.shape)}")
        check_heads(q.shape[1], q.shape[3], kv_shape[1], kv_shape[3])
        for name, tensor in tensors.items():
            if name != "out" and (tensor.dtype != self.k.dtype or tensor.device != self.k.device):
                raise KVLibError(
                    f"{name} must be {self.k.dtype} on {self.k.device} like the cache, "
                    f"not {tensor.dtype} on {tensor.device}"
                )
        if out is not None and out.shape != q.shape:
            raise KVLibError(f"out must have q's shape {tuple(q.shape)}, not {tuple(out.shape)}")
        if out is not None and num_new == 1 and self._runs_pool_decoder(q):
            if out.dtype != torch.float32 or not out.is_contiguous():
                raise KVLibError(f"out must be a contiguous float32 tensor, not {out.dtype}")

    def _runs_pool_decoder(self, q: torch.Tensor) -> bool:
        """Does this decode step go straight to the numba kernel (a
        :class:`~kvlib.kernels.pool_decoder.PoolDecoder`)? Where ``decode_kernel`` names numba's and q
        is float32; other kernels, and other queries, go through :func:`~kvlib.kernels.decode_attention`."""
        kernel = default_kernel(q.device) if self.decode_kernel is None else self.decode_kernel
        return self._decoder is not None and kernel == "numba" and q.dtype == torch.float32

    def read(self, seq_id: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored K and V of one sequence in one layer, each (num_kv_heads, seq_len, head_dim)."""
        require_int(layer, "layer", 0, self.num_layers - 1)  # -1 would read the last layer unasked
        table = torch.tensor(self.manager.block_table(seq_id), device=self.k.device)[None]  # (1, blocks)
        length = self.manager.num_computed(seq_id)
        # (1, blocks * block_size, kv_heads, head_dim) each
        k, v = gather_blocks(self.k[layer], table), gather_blocks(self.v[layer], table)
        # (seq_len, kv_heads, head_dim) -> (kv_heads, seq_len, head_dim)
        return k[0, :length].transpose(0, 1), v[0, :length].transpose(0, 1)
