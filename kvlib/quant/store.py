"""One layer's keys and values held in a :class:`~kvlib.quant.formats.KVQuantFormat` (the quality chapter).

:class:`QuantizedKVStore` is the bookkeeping of a quantized cache, apart from any model:
tokens arrive (``append``) into a full-precision residual; whenever the residual holds
``residual_length`` tokens (at once, if there is no residual), the oldest full group of them
is quantized into a chunk: per token for ``int*`` and ``fp8``; for KIVI, the keys per channel
(the chunk's ``residual_length`` tokens of each channel share one scale and zero point) and the
values per token. ``keys()`` / ``values()`` give everything held, dequantized, in token order:
what the attention of :class:`kvlib.cache.quantized.QuantizedKVCache` reads.

Dequantized chunks are kept as a working copy, so that a decode step dequantizes only its new
chunk (a fused kernel would dequantize on the fly instead); :attr:`num_bytes` counts only what
the format stores: packed codes, scales, zero points and the residual.
"""

from __future__ import annotations

import torch

from kvlib import KVLibError
from kvlib.quant.formats import KVQuantFormat
from kvlib.quant.fp8 import Fp8Tensor, quantize_fp8
from kvlib.quant.minmax import QuantizedTensor, check_floats, quantize_minmax


class QuantizedKVStore:
    """K and V of one layer, (batch, kv_heads, tokens, head_dim), stored in ``fmt``."""

    def __init__(self, fmt: KVQuantFormat):
        if not isinstance(fmt, KVQuantFormat):
            raise KVLibError(f"fmt must be a KVQuantFormat (see kv_quant_format), not {type(fmt).__name__}")
        self.fmt = fmt
        self.chunks: list[tuple[QuantizedTensor | Fp8Tensor, QuantizedTensor | Fp8Tensor]] = []  # (K, V)
        self._k_done: list[torch.Tensor] = []  # dequantized keys of each chunk, a working copy
        self._v_done: list[torch.Tensor] = []  # dequantized values of each chunk
        self.k_residual: torch.Tensor | None = None  # (batch, kv_heads, num_residual, head_dim), unquantized
        self.v_residual: torch.Tensor | None = None
        self.num_quantized = 0  # tokens per sequence held in chunks
        self.quantized_at: list[int] = []  # for each chunk, the token count after which it was quantized

    @property
    def num_residual(self) -> int:
        """Tokens per sequence held unquantized."""
        return 0 if self.k_residual is None else self.k_residual.shape[2]

    @property
    def length(self) -> int:
        """Tokens per sequence held in all."""
        return self.num_quantized + self.num_residual

    @property
    def num_bytes(self) -> int:
        """Bytes the format stores: every chunk's codes and metadata plus the residual's tensors."""
        held = sum(k.num_bytes + v.num_bytes for k, v in self.chunks)
        for t in (self.k_residual, self.v_residual):
            held += 0 if t is None else t.numel() * t.element_size()
        return held

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add new tokens' k, v (batch, kv_heads, num_new, head_dim); quantize every full group."""
        quantized = self.fmt.bits is not None  # only quantized formats store fp16 metadata
        check_floats(k, "k", within_fp16=quantized)
        check_floats(v, "v", within_fp16=quantized)
        if k.ndim != 4 or k.shape != v.shape or k.dtype != v.dtype:
            raise KVLibError(
                f"k and v must be (batch, kv_heads, num_new, head_dim) of one dtype, not "
                f"{tuple(k.shape)} {k.dtype} and {tuple(v.shape)} {v.dtype}"
            )
        if 0 in k.shape:
            raise KVLibError(f"k and v must hold at least one token of one head, not shape {tuple(k.shape)}")
        if self.k_residual is not None:
            if k.shape[:2] + k.shape[3:] != self.k_residual.shape[:2] + self.k_residual.shape[3:]:
                raise KVLibError(
                    f"k of shape {tuple(k.shape)} does not extend {tuple(self.k_residual.shape)}"
                )
            if k.dtype != self.k_residual.dtype:
                raise KVLibError(f"k is {k.dtype} but the store holds {self.k_residual.dtype}")
            k, v = torch.cat([self.k_residual, k], dim=2), torch.cat([self.v_residual, v], dim=2)
        total = self.num_quantized + k.shape[2]
        step = self.fmt.residual_length or k.shape[2]  # no residual: quantize all that came
        num_full = 0 if self.fmt.bits is None else (k.shape[2] // step) * step
        if num_full:
            self._quantize(k[:, :, :num_full], v[:, :, :num_full], step)
            self.quantized_at.append(total)
        self.k_residual, self.v_residual = k[:, :, num_full:], v[:, :, num_full:]

    def _quantize(self, k: torch.Tensor, v: torch.Tensor, step: int) -> None:
        """Quantize ``k.shape[2]`` tokens (a multiple of ``step``), one chunk per ``step`` tokens for KIVI."""
        fmt = self.fmt
        if fmt.per_channel_keys:
            for start in range(0, k.shape[2], step):
                self._add_chunk(k[:, :, start : start + step], v[:, :, start : start + step])
        else:
            self._add_chunk(k, v)

    def _add_chunk(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize one chunk of tokens and keep its dequantized working copy."""
        fmt = self.fmt
        if fmt.is_fp8:
            qk, qv = quantize_fp8(k, fmt.group_size), quantize_fp8(v, fmt.group_size)
        else:
            qv = quantize_minmax(v, fmt.bits, fmt.group_size or v.shape[-1])
            if fmt.per_channel_keys:  # channels' values over the chunk's tokens: (b, h, head_dim, tokens)
                qk = quantize_minmax(k.transpose(2, 3), fmt.bits, fmt.residual_length)
            else:
                qk = quantize_minmax(k, fmt.bits, fmt.group_size or k.shape[-1])
        self.chunks.append((qk, qv))
        k_back = qk.dequantize()
        self._k_done.append(k_back.transpose(2, 3) if fmt.per_channel_keys else k_back)
        self._v_done.append(qv.dequantize())
        self.num_quantized += k.shape[2]

    def keys(self) -> torch.Tensor:
        """Every key held, dequantized, in token order: (batch, kv_heads, length, head_dim)."""
        return self._gather(self._k_done, self.k_residual)

    def values(self) -> torch.Tensor:
        """Every value held, dequantized, in token order: (batch, kv_heads, length, head_dim)."""
        return self._gather(self._v_done, self.v_residual)

    @staticmethod
    def _gather(done: list[torch.Tensor], residual: torch.Tensor | None) -> torch.Tensor:
        if residual is None:
            raise KVLibError("the store is empty: append keys and values first")
        parts = [*done, residual] if residual.shape[2] else done
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
