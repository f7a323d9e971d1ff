"""How K and V values are stored, and how many bytes one stored vector takes (chapter 2).

A :class:`KVDtype` is a storage format of the cache: fp32, fp16 and bf16 store their
bits; fp8 stores one byte per value (with one scale per tensor, which we neglect); int8 and
int4 store 8 or 4 bits per value plus, for every group of ``group_size`` consecutive values
of a vector (default 32), one fp16 scale and one fp16 zero point (asymmetric min-max
quantization, as in KIVI-style KV quantizers). :meth:`KVDtype.vector_bytes` is the one
place that turns a vector's length into bytes; :data:`KV_DTYPES` names the formats the
book uses, and :func:`kv_dtype` looks one up by name. Weights use the same formats
(:func:`kvlib.sizing.capacity.weight_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.units import ceil_div

# The widest stored value kvlib sizes (fp64 is 64 bits); a format wider than this is a typo.
MAX_BITS = 64


@dataclass(frozen=True)
class KVDtype:
    """How cached values are stored: ``bits`` per value, plus per-group metadata for integer formats."""

    name: str  # as the book and the CLI spell it: "fp16", "int4" ...
    bits: int  # bits of one stored value (scales and zero points not included)
    group_size: int | None = None  # values sharing one scale (and zero point); None: no per-group metadata
    meta_bytes: int = 0  # bytes of metadata per group: fp16 scale + fp16 zero point = 4

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise KVLibError(f"a KVDtype's name must be a non-empty string, not {self.name!r:.60}")
        require_int(self.bits, "bits", low=1, high=MAX_BITS)
        if self.group_size is not None:
            require_int(self.group_size, "group_size", low=1)
        require_int(self.meta_bytes, "meta_bytes", low=0)

    def vector_bytes(self, length: int) -> int:
        """Bytes of one stored vector of ``length`` values (a key, a value, or an MLA latent)."""
        require_int(length, "length", low=0)
        data = ceil_div(length * self.bits, 8)  # ceil: a 4-bit vector of odd length still fills its last byte
        groups = ceil_div(length, self.group_size) if self.group_size else 0
        return data + groups * self.meta_bytes

    def describe(self) -> str:
        """The format in words, as ``python -m kvlib size`` prints it."""
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
    if not isinstance(dtype, str) or dtype not in KV_DTYPES:
        raise KVLibError(f"unknown KV dtype {dtype!r:.60}; choose from {', '.join(KV_DTYPES)}")
    return KV_DTYPES[dtype]
