"""The contiguous cache of chapter 1 tuned for speed: a decode step that allocates nothing.

:class:`FastContiguousKVCache` holds what :class:`~kvlib.cache.contiguous.ContiguousKVCache`
holds and gives the same attention (to float32 rounding); it is chosen explicitly, by the
benchmarks of chapters 1 and 2 and by :class:`~kvlib.cache.generation.Decoder` for the lean model
(:class:`~kvlib.model.lean.LeanLlama`). What it adds: each layer's K/V are views of one
reservation, written in place with ``index_copy_``, and the positions are a view of one
``arange``. The reservation is stored token-major, so that each sequence of a layer is one
block of chapter 3's pool: on a CPU one new token attends with the numba kernel of chapters 2
and 3 through an identity block table (:class:`~kvlib.kernels.pool_decoder.PoolDecoder`), into a
buffer the caller gives; elsewhere through PyTorch's fused ``scaled_dot_product_attention``. A
prefill of several tokens uses :func:`~kvlib.model.attention.grouped_attention`.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.cache.contiguous import ContiguousKVCache
from kvlib.kernels.dispatch import contiguous_tables
from kvlib.kernels.pool_decoder import PoolDecoder, pool_decoder_runs
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig


class FastContiguousKVCache(ContiguousKVCache):
    """K and V of every layer in two preallocated tensors, seen as (layers, batch, kv_heads, max_len, hd).

    All sequences of the batch have the same length; ``length`` tokens are filled. The memory is
    token-major, (layers, batch, max_len, kv_heads, head_dim): each sequence of a layer is one
    block of ``max_len`` tokens in the layout of chapter 3's block pool, so that on the CPU a
    decode step attends with the numba kernel of chapters 2 and 3 (through an identity block
    table) and writes its output into a buffer of the cache: the step allocates nothing. The
    output of :meth:`attend` for one new token is that buffer, valid until the next call. The
    attributes are the readable cache's (``k``, ``v``, ``positions``, ``max_len``, ``length``), and
    so are ``num_bytes`` and the bookkeeping of :meth:`prepare`.
    """

    reuses_buffers = True  # attend copies k, v into the reservation and takes out= (model.config.KVCache)

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int, device=None, dtype=torch.float32):
        # not ContiguousKVCache.__init__: its reservation has the other layout, and may be gigabytes
        if batch_size < 1 or max_len < 1:
            raise KVLibError(f"batch_size and max_len must be positive, not {batch_size} and {max_len}")
        # (layers, batch, max_len, kv_heads, head_dim) each, in memory
        shape = (config.num_layers, batch_size, max_len, config.num_kv_heads, config.head_dim)
        self._k_tokens = torch.zeros(shape, device=device, dtype=dtype)
        self._v_tokens = torch.zeros(shape, device=device, dtype=dtype)
        # the same memory as (layers, batch, kv_heads, max_len, head_dim) views, the model's layout
        self.k, self.v = self._k_tokens.transpose(2, 3), self._v_tokens.transpose(2, 3)
        # per layer: a view of self.k / self.v, (batch, kv_heads, max_len, head_dim)
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)
        self._arange = torch.arange(max_len, device=device)  # (max_len,): every slot's index
        # (batch, max_len): every slot's position, of which prepare hands out views
        self.positions = self._arange.expand(batch_size, max_len)
        self._slots = self._arange[:0]  # (num_new,): the slots of the current step's tokens, a view
        self.max_len = max_len  # tokens per sequence the reservation holds
        self.length = 0  # tokens per sequence filled (after the current step's prepare)
        self._start = 0  # position of the current step's first new token
        self._decoder = None  # the numba kernel over the reservation, where it runs
        if pool_decoder_runs(device, dtype):  # layer l, sequence i: block i of a pool of `batch` blocks
            self._decoder = PoolDecoder(self._k_tokens.unbind(0), self._v_tokens.unbind(0))
            self._block_tables = contiguous_tables(batch_size, 1, device=device)  # (batch, 1): block i
            self._seq_lens = torch.zeros(batch_size, dtype=torch.long, device=device)  # (batch,): length

    def prepare(self, num_new: int) -> torch.Tensor:
        """Reserve slots ``length .. length + num_new - 1``; return those positions, (batch, num_new)."""
        positions = super().prepare(num_new)  # (batch, num_new): a view
        self._slots = self._arange[self._start : self.length]  # (num_new,): a view
        if self._decoder is not None and num_new == 1:
            self._seq_lens.fill_(self.length)  # in place: the kernel's keys per sequence
        return positions

    def attend(self, layer: int, q, k, v, out: torch.Tensor | None = None) -> torch.Tensor:
        """Write k, v (batch, kv_heads, num_new, head_dim) into their slots; attend q over all filled slots.

        q: (batch, heads, num_new, head_dim); returns (batch, heads, num_new, head_dim). ``out``, a
        float32 tensor of q's shape, receives a decode step's attention where the numba kernel runs.
        """
        start, end = self._start, self.length
        # write the new slots in place: nothing stored is copied
        self.k_layers[layer].index_copy_(2, self._slots, k)
        self.v_layers[layer].index_copy_(2, self._slots, v)
        if end - start == 1 and self._decoder is not None and q.dtype == torch.float32:  # the fused kernel
            return self._decoder.attend(layer, q, self._block_tables, self._seq_lens, end, out)
        # the filled slots: (batch, kv_heads, end, head_dim) each, views of the reservation
        keys, values = self.k_layers[layer].narrow(2, 0, end), self.v_layers[layer].narrow(2, 0, end)
        if end - start > 1:  # a prefill: every new query attends to the keys up to its own
            return grouped_attention(q, keys, values, q_start=start)  # (batch, heads, num_new, head_dim)
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)  # (batch, heads, 1, hd)
