"""The quantized KV formats the quality chapter compares, and their bytes per token.

A :class:`KVQuantFormat` says how a cache stores each token's key and value vectors:

- ``none``: as the model computed them (the reference);
- ``int8`` / ``int4`` / ``int2``: per token, asymmetric min-max in groups of ``group_size``
  values of the vector (:mod:`kvlib.quant.minmax`), codes packed;
- ``fp8``: per token, e4m3 with one fp16 scale per group (:mod:`kvlib.quant.fp8`);
- ``kivi4`` / ``kivi2``: KIVI (Liu et al. 2024, "KIVI: a tuning-free asymmetric 2bit
  quantization for KV cache"): keys per **channel** (each channel's values over a group of
  ``residual_length`` tokens share a scale and zero point), values per token, and the most
  recent tokens in full precision until ``residual_length`` of them have gathered.

Every format may keep a residual of up to ``residual_length - 1`` recent tokens unquantized
(as transformers' ``QuantizedCache`` does); when the residual reaches ``residual_length``
tokens, all of them are quantized at once. Per-token formats default to no residual.

Bytes come from :class:`kvlib.sizing.dtypes.KVDtype`, the chapter 2 class that already
counts "bits per value plus 4 bytes of fp16 scale and zero point per group": one copy of that
arithmetic, here applied to int2, to fp8 with its scales, and to KIVI's per-channel keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.checks import is_int, require_int
from kvlib.sizing.dtypes import KVDtype

MINMAX_META_BYTES = 4  # an fp16 scale + an fp16 zero point per group (kvlib.sizing.dtypes' int8/int4)
FP8_META_BYTES = 2  # one fp16 scale per group: fp8 is symmetric, no zero point
KIVI_DEFAULT_RESIDUAL = 128  # KIVI's R (and transformers' QuantizedCache residual_length)
DEFAULT_GROUP_SIZE = 32  # values per group of a token's vector, as kvlib.sizing.dtypes' int8/int4
FORMAT_NAMES = ("none", "int8", "int4", "int2", "fp8", "kivi4", "kivi2")


@dataclass(frozen=True)
class KVQuantFormat:
    """How a quantized cache stores K and V (see the module); build one with :func:`kv_quant_format`."""

    name: str  # one of FORMAT_NAMES
    bits: int | None  # bits of one stored code (8 for fp8); None for "none"
    group_size: int | None  # values of a token's vector per scale (values, and keys unless KIVI); None: all
    residual_length: int  # tokens gathered unquantized before quantizing them together; KIVI's key group
    per_channel_keys: bool  # KIVI: keys grouped along tokens, one scale and zero point per channel

    def __post_init__(self):
        if self.name not in FORMAT_NAMES:
            raise KVLibError(
                f"unknown KV quantization format {self.name!r}; choose from {', '.join(FORMAT_NAMES)}"
            )
        if self.bits not in ((None,) if self.name == "none" else (2, 4, 8)):
            raise KVLibError(f"bits must be one of (2, 4, 8) for {self.name}, not {self.bits!r}")
        if self.group_size is not None and (
            not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or self.group_size < 1
        ):
            raise KVLibError(f"group_size must be a positive integer, not {self.group_size!r}")
        r = self.residual_length
        if not is_int(r) or r < 0:
            raise KVLibError(f"residual_length must be a non-negative integer, not {r!r}")
        if self.per_channel_keys and r < 1:
            raise KVLibError("KIVI groups keys over residual_length tokens: residual_length must be >= 1")

    @property
    def is_fp8(self) -> bool:
        """True for the fp8 e4m3 format (scaled, not min-max)."""
        return self.name == "fp8"

    def token_dtype(self, head_dim: int) -> KVDtype:
        """The chapter 2 :class:`KVDtype` of one token's quantized vector (a value; a key unless KIVI)."""
        require_int(head_dim, "head_dim", low=1)
        if self.bits is None:
            raise KVLibError("format 'none' stores vectors as computed: it has no quantized dtype")
        group = min(self.group_size or head_dim, head_dim)  # a larger group is one group of the vector
        if self.is_fp8:
            return KVDtype("fp8", 8, group_size=group, meta_bytes=FP8_META_BYTES)
        return KVDtype(f"int{self.bits}", self.bits, group_size=group, meta_bytes=MINMAX_META_BYTES)

    def channel_dtype(self) -> KVDtype:
        """KIVI's keys: one channel over ``residual_length`` tokens is one group with one scale and zero."""
        r = self.residual_length
        return KVDtype(f"int{self.bits}", self.bits, group_size=r, meta_bytes=MINMAX_META_BYTES)

    def num_residual(self, num_tokens: int) -> int:
        """Tokens of a context of ``num_tokens`` still unquantized: ``num_tokens mod residual_length``."""
        num_tokens = require_int(num_tokens, "num_tokens", low=0)
        if self.bits is None:
            return num_tokens  # nothing is ever quantized
        return num_tokens % self.residual_length if self.residual_length else 0

    def quantized_bytes_per_token(self, head_dim: int) -> float:
        """Bytes of one quantized token's K and V in one KV head of one layer, metadata included.

        KIVI's per-channel key metadata is shared by ``residual_length`` tokens and counted
        here amortised over them; the residual's full-precision tokens are not included
        (see :meth:`context_bytes`).
        """
        value_bytes = self.token_dtype(head_dim).vector_bytes(head_dim)  # head_dim checked there
        if not self.per_channel_keys:
            return 2 * value_bytes
        key_group_bytes = head_dim * self.channel_dtype().vector_bytes(self.residual_length)
        return key_group_bytes / self.residual_length + value_bytes

    def context_bytes(self, num_tokens: int, head_dim: int, element_bytes: int = 2) -> int:
        """Exact bytes of K and V for ``num_tokens`` tokens in one KV head of one layer.

        Quantized tokens at :meth:`quantized_bytes_per_token`, plus the residual's
        ``num_residual(num_tokens)`` tokens at ``element_bytes`` per value (fp16: 2).
        """
        require_int(num_tokens, "num_tokens", low=0)
        require_int(head_dim, "head_dim", low=1)
        require_int(element_bytes, "element_bytes", low=1)
        residual = self.num_residual(num_tokens)
        full = residual * 2 * head_dim * element_bytes
        if self.bits is None:
            return full
        quantized = num_tokens - residual  # a multiple of residual_length when there is one
        return round(quantized * self.quantized_bytes_per_token(head_dim)) + full


def kv_quant_format(
    name: str, group_size: int | None = None, residual_length: int | None = None
) -> KVQuantFormat:
    """The format ``name`` (one of :data:`FORMAT_NAMES`), with its defaults for omitted parameters.

    Defaults: ``group_size`` 32 for the integer formats, the whole vector for fp8;
    ``residual_length`` 0 (per-token formats) or 128 (KIVI, as in the paper).
    """
    if name not in FORMAT_NAMES:
        raise KVLibError(f"unknown KV quantization format {name!r}; choose from {', '.join(FORMAT_NAMES)}")
    kivi = name.startswith("kivi")
    if residual_length is None:
        residual_length = KIVI_DEFAULT_RESIDUAL if kivi else 0
    if name == "none":
        return KVQuantFormat(name, None, None, residual_length, False)
    if group_size is None and name != "fp8":
        group_size = DEFAULT_GROUP_SIZE
    bits = 8 if name == "fp8" else int(name.removeprefix("kivi").removeprefix("int"))
    return KVQuantFormat(name, bits, group_size, residual_length, kivi)
