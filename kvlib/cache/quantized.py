"""A KV cache that stores keys and values quantized and attends over them dequantized (the quality chapter).

:class:`QuantizedKVCache` implements the model's two-method protocol
(:class:`~kvlib.model.config.KVCache`) like :class:`~kvlib.cache.contiguous.ContiguousKVCache`,
but each layer's K and V go into a :class:`~kvlib.quant.store.QuantizedKVStore` in a
:class:`~kvlib.quant.formats.KVQuantFormat` (int8/int4/int2 per token, fp8, KIVI, or
``none``). Chapter 7 ("What a smaller cache costs") runs the trained model through it
to measure what each format costs in perplexity and greedy-token agreement.

A step first stores its new tokens, then attends over everything held: the queries of a
prefill see their own chunk's quantized K and V, as a later decode step would. With KIVI this
differs from decoding the same tokens one by one (which would see the most recent ones in the
full-precision residual); feed the sequence in steps to reproduce decode exactly. The
attention paths are the contiguous cache's (PyTorch's fused kernel for one new token, grouped
attention for several), so that format ``none`` gives its outputs.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.checks import check_new_tokens, require_int
from kvlib.kernels.shape_checks import check_step
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig
from kvlib.quant.formats import KVQuantFormat, kv_quant_format
from kvlib.quant.store import QuantizedKVStore


class QuantizedKVCache:
    """One :class:`QuantizedKVStore` per layer; all sequences of the batch have the same length."""

    def __init__(
        self,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        fmt: KVQuantFormat | str = "int8",
        device=None,
    ):
        batch_size, max_len = require_int(batch_size, "batch_size"), require_int(max_len, "max_len")
        self.fmt = kv_quant_format(fmt) if isinstance(fmt, str) else fmt
        self.layers = [QuantizedKVStore(self.fmt) for _ in range(config.num_layers)]  # one store per layer
        self.config = config  # the model's shape: num_kv_heads and head_dim of the K/V handed in
        self.batch_size = batch_size  # sequences per step
        self.max_len = max_len  # tokens per sequence the cache accepts
        self.positions = torch.arange(max_len, device=device).expand(batch_size, max_len)  # (batch, max_len)
        self.length = 0  # tokens per sequence (after the current step's prepare)
        self._start = 0  # position of the current step's first new token

    @property
    def num_bytes(self) -> int:
        """Bytes the format stores in all layers (codes, scales, zero points, residual)."""
        return sum(store.num_bytes for store in self.layers)

    def prepare(self, num_new: int) -> torch.Tensor:
        """Count ``num_new`` more tokens per sequence; return their positions, (batch, num_new)."""
        check_new_tokens(num_new, self.length, self.max_len)
        self._start, self.length = self.length, self.length + num_new
        return self.positions[:, self._start : self.length]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v (batch, kv_heads, num_new, head_dim); attend q over every token held, dequantized.

        q: (batch, heads, num_new, head_dim); returns (batch, heads, num_new, head_dim).
        """
        expected = (
            self.batch_size,
            self.config.num_kv_heads,
            self.length - self._start,
            self.config.head_dim,
        )
        check_step(layer, len(self.layers), q, k, v, expected)
        store = self.layers[layer]
        if store.length != self._start:
            raise KVLibError(f"layer {layer} holds {store.length} tokens; this step starts at {self._start}")
        store.append(k, v)
        keys, values = store.keys(), store.values()  # (batch, kv_heads, length, head_dim) each
        if self.length - self._start == 1:  # decode: one query at the end of its keys
            return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
        return grouped_attention(q, keys, values, q_start=self._start)
