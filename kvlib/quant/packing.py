"""Packing small integers into bytes: two 4-bit or four 2-bit codes per ``uint8`` (the quality chapter).

A quantized cache only saves memory if its codes are stored at their width: an int4 code
kept in a ``uint8`` tensor takes the bytes of int8. :func:`pack_codes` puts ``8 // bits``
codes into each byte (code ``i`` of a byte in bits ``bits*i .. bits*i + bits - 1``, the
lowest first, as KIVI's and vLLM's int4 packers do); :func:`unpack_codes` undoes it exactly.
A vector of ``length`` codes takes ``ceil(length * bits / 8)`` bytes, the data part of
:meth:`kvlib.sizing.dtypes.KVDtype.vector_bytes`.
"""

from __future__ import annotations

import numbers

import torch
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.units import ceil_div

PACKED_BITS = (2, 4, 8)  # code widths that fill a byte exactly


def check_bits(bits: int) -> int:
    """``bits`` if it is one of :data:`PACKED_BITS`; a one-line KVLibError otherwise."""
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or bits not in PACKED_BITS:
        raise KVLibError(f"bits must be one of {PACKED_BITS} (an integer), not {bits!r}")
    return 8 // int(bits)  # codes per byte


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes in ``0 .. 2**bits - 1`` along the last dim: (..., length) -> (..., ceil(length*bits/8)).

    The last byte of a vector whose length is not a multiple of ``8 // bits`` is padded with
    zero codes. Returns ``uint8``.
    """
    check_bits(bits)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8 or codes.ndim == 0:
        what = f"{codes.dtype} of shape {tuple(codes.shape)}" if isinstance(codes, torch.Tensor) else codes
        raise KVLibError(f"codes must be a uint8 tensor with a last dim, not {what!r}"[:200])
    if codes.numel() and int(codes.max()) > 2**bits - 1:
        raise KVLibError(
            f"codes must lie in 0..{2**bits - 1} to fit {bits} bits, not up to {int(codes.max())}"
        )
    return pack_checked(codes, int(bits))


def pack_checked(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`pack_codes` of codes known to fit (a quantizer's clamped codes): no check, no reduction."""
    per_byte = 8 // bits
    if per_byte == 1:
        return codes
    length = codes.shape[-1]
    padded = F.pad(codes, (0, -length % per_byte))  # (..., multiple of per_byte)
    grouped = padded.view(*codes.shape[:-1], ceil_div(length, per_byte), per_byte)  # (..., bytes, per_byte)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)  # (per_byte,)
    return (grouped << shifts).sum(dim=-1, dtype=torch.uint8)  # disjoint bits: the sum is an OR


def unpack_codes(packed: torch.Tensor, bits: int, length: int) -> torch.Tensor:
    """The ``length`` codes of each vector packed by :func:`pack_codes`: (..., num_bytes) -> (..., length)."""
    per_byte = check_bits(bits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.ndim == 0:
        what = (
            f"{packed.dtype} of shape {tuple(packed.shape)}" if isinstance(packed, torch.Tensor) else packed
        )
        raise KVLibError(f"packed codes must be a uint8 tensor with a last dim, not {what!r}"[:200])
    length = require_int(length, "length", low=0)
    if packed.shape[-1] != ceil_div(length * bits, 8):
        raise KVLibError(
            f"length {length} at {bits} bits needs {ceil_div(length * bits, 8)} bytes per vector, "
            f"but the packed codes have {packed.shape[-1]}"
        )
    if per_byte == 1:
        return packed[..., :length]
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)  # (per_byte,)
    codes = (packed[..., None] >> shifts) & (2**bits - 1)  # (..., num_bytes, per_byte)
    return codes.flatten(-2)[..., :length]
