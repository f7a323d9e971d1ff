"""Contiguous KV caches: one preallocated and written in place, one grown by concatenation.

Both implement the model's two-method cache protocol (:class:`~kvlib.model.config.KVCache`:
``prepare``, ``attend``). Chapter 1 compares them: the preallocated cache writes each new
token's K and V into its slot, while the concatenating cache copies everything it holds at
every step, which is the trap of growing arrays with ``torch.cat`` / ``np.vstack``. Both attend
with :func:`~kvlib.model.attention.grouped_attention`.

This is the readable cache the book shows. The same preallocated cache tuned for speed (a decode
step that allocates nothing, the numba kernel on a CPU) is
:class:`~kvlib.cache.fast_contiguous.FastContiguousKVCache`, which the benchmarks choose. Chapter 2
checks their byte counts against the size formula (:mod:`kvlib.chapters.ch02_cache_size.size_check`);
:func:`kv_bytes_per_token` is that formula's (:func:`~kvlib.sizing.spec.kv_cache_bytes`) for one token.
"""

from __future__ import annotations

import torch

from kvlib import KVLibError
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig
from kvlib.sizing.spec import kv_cache_bytes


class ContiguousKVCache:
    """K and V of every layer in two preallocated tensors, (layers, batch, kv_heads, max_len, head_dim) each.

    All sequences of the batch have the same length; ``length`` tokens are filled. Each step writes
    its new tokens' K and V into their slots: nothing already stored is copied. (The same cache
    tuned so that a step allocates nothing is :class:`~kvlib.cache.fast_contiguous.FastContiguousKVCache`.)
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int, device=None, dtype=torch.float32):
        if batch_size < 1 or max_len < 1:
            raise KVLibError(f"batch_size and max_len must be positive, not {batch_size} and {max_len}")
        shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        # (batch, max_len): every slot's position, of which prepare hands out views
        self.positions = torch.arange(max_len, device=device).expand(batch_size, max_len)
        self.max_len = max_len  # tokens per sequence the reservation holds
        self.length = 0  # tokens per sequence filled (after the current step's prepare)
        self._start = 0  # position of the current step's first new token

    @property
    def num_bytes(self) -> int:
        """Bytes held by the K and V tensors (the whole reservation, filled or not)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def prepare(self, num_new: int) -> torch.Tensor:
        """Reserve slots ``length .. length + num_new - 1``; return those positions, (batch, num_new)."""
        if self.length + num_new > self.max_len:
            raise KVLibError(f"cache full: {self.length} + {num_new} tokens exceed max_len {self.max_len}")
        self._start, self.length = self.length, self.length + num_new
        return self.positions[:, self._start : self.length]

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        """Write k, v (batch, kv_heads, num_new, head_dim) into their slots; attend q over all filled slots.

        q: (batch, heads, num_new, head_dim); returns (batch, heads, num_new, head_dim).
        """
        start, end = self._start, self.length
        self.k[layer, :, :, start:end] = k  # the new slots, in place
        self.v[layer, :, :, start:end] = v
        keys, values = self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # every filled slot: views
        return grouped_attention(q, keys, values, q_start=start)  # each new query sees keys up to its own


def kv_bytes_per_token(config: ModelConfig, dtype=torch.float32) -> int:
    """Bytes one token's K and V take in every layer (:func:`~kvlib.sizing.spec.kv_cache_bytes` at
    one token): 2 x layers x kv_heads x head_dim x element size."""
    element = torch.empty((), dtype=dtype).element_size()
    return kv_cache_bytes(config.num_layers, config.num_kv_heads, config.head_dim, 1, dtype_bytes=element)


def concat_bytes_copied(
    config: ModelConfig, num_steps: int, batch_size: int = 1, prompt_len: int = 1, dtype=torch.float32
) -> int:
    """Bytes a :class:`ConcatKVCache` copies while generating ``num_steps`` tokens after a prompt.

    The first step stores the prompt's K and V (no copy); every later step builds new
    tensors one token longer and copies the whole cache into them: prompt_len + 1,
    prompt_len + 2, ... tokens, a total that grows with the square of the length.
    """
    lengths = range(prompt_len + 1, prompt_len + num_steps)
    return batch_size * kv_bytes_per_token(config, dtype) * sum(lengths)


class ConcatKVCache:
    """K and V of every layer grown with ``torch.cat`` at every step (copies the whole cache each time).

    ``bytes_copied`` counts the bytes that the concatenations have written so far.
    """

    def __init__(self, config: ModelConfig, device=None):
        self.device = device
        # per layer: (batch, kv_heads, length, head_dim), None before the first step
        self.k: list[torch.Tensor | None] = [None] * config.num_layers
        self.v: list[torch.Tensor | None] = [None] * config.num_layers
        self.length = 0  # tokens per sequence held (after the current step's prepare)
        self._start = 0  # position of the current step's first new token
        self.bytes_copied = 0  # bytes written by the concatenations so far

    @property
    def num_bytes(self) -> int:
        """Bytes held by the K and V tensors now (exactly what is stored: no reservation)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)

    def prepare(self, num_new: int) -> torch.Tensor:
        """Count ``num_new`` more tokens; return their positions, (1, num_new), broadcast over the batch."""
        self._start, self.length = self.length, self.length + num_new
        return torch.arange(self._start, self.length, device=self.device)[None, :]

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        """Append k, v (batch, kv_heads, num_new, head_dim) by concatenation; attend q over all of them.

        q: (batch, heads, num_new, head_dim); returns (batch, heads, num_new, head_dim).
        """
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k], dim=2)  # (batch, kv_heads, length, head_dim), a fresh copy
            v = torch.cat([self.v[layer], v], dim=2)  # (batch, kv_heads, length, head_dim), another
            self.bytes_copied += 2 * k.numel() * k.element_size()
        self.k[layer], self.v[layer] = k, v
        return grouped_attention(q, k, v, q_start=self._start)  # (batch, heads, num_new, head_dim)
