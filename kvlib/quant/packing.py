"""Packing small integers into bytes: two 4-bit or four 2-bit codes per ``uint8`` (the quality chapter).

A quantized cache only saves memory if its codes are stored at their width: an int4 code
kept in a ``uint8`` tensor takes the bytes of int8. :func:`pack_codes` puts ``8 // bits``
codes into each byte (code ``i`` of a byte in bits ``bits*i .. bits*i + bits - 1``, the
lowest first, as KIVI's and vLLM's int4 packers do); :func:`unpack_codes` undoes it exactly.
A vector of ``length`` codes takes ``ceil(length * bits / 8)`` bytes, the data part of
:meth:`kvlib.sizing.dtypes.KVDtype.vector_bytes`.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from kvlib import KVLibError

PACKED_BITS = (2, 4, 8)  # code widths that fill a byte exactly


def _check_bits(bits: int) -> int:
    """``bits`` if it is one of :data:`PACKED_BITS`; a one-line KVLibError otherwise."""
    if bits not in PACKED_BITS:
        raise KVLibError(f"bits must be one of {PACKED_BITS}, not {bits!r}")
    return 8 // bits  # codes per byte


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes in ``0 .. 2**bits - 1`` along the last dim: (..., length) -> (..., ceil(length*bits/8)).

    The last byte of a vector whose length is not a multiple of ``8 // bits`` is padded with
    zero codes. Returns ``uint8``.
    """
    per_byte = _check_bits(bits)
    if codes.dtype != torch.uint8:
        raise KVLibError(f"codes must be uint8, not {codes.dtype}")
    if per_byte == 1:
        return codes
    length = codes.shape[-1]
    padded = F.pad(codes, (0, -length % per_byte))  # (..., multiple of per_byte)
    grouped = padded.view(*codes.shape[:-1], -1, per_byte)  # (..., num_bytes, per_byte)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)  # (per_byte,)
    return (grouped << shifts).sum(dim=-1, dtype=torch.uint8)  # disjoint bits: the sum is an OR


def unpack_codes(packed: torch.Tensor, bits: int, length: int) -> torch.Tensor:
    """The ``length`` codes of each vector packed by :func:`pack_codes`: (..., num_bytes) -> (..., length)."""
    per_byte = _check_bits(bits)
    if packed.dtype != torch.uint8:
        raise KVLibError(f"packed codes must be uint8, not {packed.dtype}")
    if per_byte == 1:
        return packed[..., :length]
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)  # (per_byte,)
    codes = (packed[..., None] >> shifts) & (2**bits - 1)  # (..., num_bytes, per_byte)
    return codes.flatten(-2)[..., :length]
