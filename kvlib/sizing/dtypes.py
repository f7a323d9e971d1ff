"""Exact KV-cache byte counts for real models (chapter 2).

The cache of one attention layer holds, for every cached token, one key and one value
vector per KV head, so the whole cache is

    bytes = 2 x num_attention_layers x num_kv_heads x head_dim x tokens x batch x bytes_per_value

(the formula of the source article of this book). Real models bend it in five ways,
all handled here from a single description, :class:`ModelSpec`:

- **GQA / MQA**: ``num_kv_heads`` below ``num_heads`` (MQA: one).
- **Sliding-window layers** (Mistral, Gemma-2): such a layer never caches more than its
  window, ``min(tokens, window)`` tokens.
- **Hybrid models** (Jamba): only some layers are attention layers; the others keep a
  fixed-size state and no KV cache.
- **MLA** (DeepSeek-V2/V3): each layer caches one latent vector of
  ``kv_lora_rank + qk_rope_head_dim`` values per token, shared by all heads, instead of
  K and V per head.
- **Encoder-decoder models** (Whisper): every decoder layer also caches the cross-attention
  K and V of all encoder positions, computed once per input and not growing with the output.

KV quantization is a :class:`KVDtype`: fp8 stores one byte per value (with one scale per
tensor, which we neglect); int8 and int4 store 8 or 4 bits per value plus, for every
group of ``group_size`` consecutive values of a vector (default 32), one fp16 scale and
one fp16 zero point (asymmetric min-max quantization, as in KIVI-style KV quantizers).

:func:`spec_from_config` builds a description from a Hugging Face ``config.json``;
``kvlib/catalog/*.json`` ships real models (each file quotes its config and its source).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.units import ceil_div


@dataclass(frozen=True)
class KVDtype:
    """How cached values are stored: ``bits`` per value, plus per-group metadata for integer formats."""

    name: str
    bits: int
    group_size: int | None = None  # values sharing one scale (and zero point); None: no per-group metadata
    meta_bytes: int = 0  # bytes of metadata per group: fp16 scale + fp16 zero point = 4

    def vector_bytes(self, length: int) -> int:
        """Bytes of one stored vector of ``length`` values (a key, a value, or an MLA latent)."""
        data = ceil_div(length * self.bits, 8)  # ceil: a 4-bit vector of odd length still fills its last byte
        groups = ceil_div(length, self.group_size) if self.group_size else 0
        return data + groups * self.meta_bytes

    def describe(self) -> str:
        if not self.group_size:
            return f"{self.name}: {self.bits} bits per value"
        return (
            f"{self.name}: {self.bits} bits per value + one fp16 scale and one fp16 zero point "
            f"per {self.group_size} values"
        )


KV_DTYPES: dict[str, KVDtype] = {
    "fp32": KVDtype("fp32", 32),
    "fp16": KVDtype("fp16", 16),
    "bf16": KVDtype("bf16", 16),
    "fp8": KVDtype("fp8", 8),
    "int8": KVDtype("int8", 8, group_size=32, meta_bytes=4),
    "int4": KVDtype("int4", 4, group_size=32, meta_bytes=4),
}


def kv_dtype(dtype: str | KVDtype) -> KVDtype:
    """A :class:`KVDtype` from its name (``"fp16"``, ``"int4"`` ...) or itself."""
    if isinstance(dtype, KVDtype):
        return dtype
    if dtype not in KV_DTYPES:
        raise KVLibError(f"unknown KV dtype {dtype!r}; choose from {', '.join(KV_DTYPES)}")
    return KV_DTYPES[dtype]
