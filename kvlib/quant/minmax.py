"""Asymmetric min-max integer quantization in groups, with packed codes (the quality chapter).

Each group of ``group_size`` consecutive values along the last dim (a token's key or value
vector for per-token quantization; a channel's values over tokens for KIVI's per-channel
keys) gets a zero point ``z`` (its minimum) and a scale ``s = (max - z) / (2**bits - 1)``,
both stored in fp16; a value ``x`` is stored as the code ``round((x - z) / s)`` in
``0 .. 2**bits - 1`` and read back as ``code * s + z``. This is the format that
:class:`kvlib.sizing.dtypes.KVDtype` counts for int8/int4 (one fp16 scale + one fp16 zero
point per 32 values), and the one KIVI and transformers' ``QuantizedCache`` use.

Why the bound ``|x - read back| <= s / 2`` holds here: the zero point is rounded *down* to
fp16 and the scale *up*, so every ``(x - z) / s`` lies in ``[0, 2**bits - 1]`` and the
rounding to the nearest code is never clamped. A group of equal fp16 values gets scale 0
and is read back exactly. The fp16 metadata bound the inputs: values beyond fp16's range
(or not finite) are refused with a KVLibError rather than stored as a silently wrong number.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.quant.packing import check_bits, pack_checked, unpack_codes

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what the quantizers accept
FP16_MAX = torch.finfo(torch.float16).max  # 65504: the largest magnitude an fp16 zero point holds


def check_floats(x: torch.Tensor, what: str = "x", within_fp16: bool = True) -> None:
    """KVLibError unless ``x`` is a tensor of :data:`FLOAT_DTYPES` (and finite, within fp16's range)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
        dtype = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise KVLibError(f"{what} must be a float32, float16 or bfloat16 tensor, not {dtype}")
    if x.is_meta:  # a shape without values: nothing to quantize (and .item() would raise)
        raise KVLibError(f"{what} must hold values, not be a meta tensor")
    # compared in float32: in bfloat16, 65504 itself rounds up to 65536, which would pass
    magnitude = x.abs() if x.dtype != torch.bfloat16 else x.abs().float()
    if within_fp16 and x.numel() and not bool((magnitude <= FP16_MAX).all()):  # NaN fails the test too
        raise KVLibError(f"{what} holds values that are not finite or beyond fp16's range (±{FP16_MAX:g})")


def check_group_size(group_size: int, length: int | None = None) -> int:
    """``group_size`` if it is a positive integer (numpy integers too); a one-line KVLibError otherwise.

    Given the vector ``length``, a larger group is one group of the whole vector, as it would be
    after padding: the size returned is then ``length`` (a group of 10**9 would otherwise pad every
    vector to 10**9 values, and one of 10**30 overflow torch's pad).
    """
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size < 1:
        raise KVLibError(f"group_size must be a positive integer, not {group_size!r}"[:200])
    return int(group_size) if length is None else min(int(group_size), length)


FP16_TINIEST = 2.0**-24  # the smallest positive float16 (a subnormal)


def fp16_scale(span: torch.Tensor, steps: int) -> torch.Tensor:
    """``span / steps`` (float32, >= 0) rounded up to fp16: a scale that covers ``span`` in ``steps`` steps.

    A span of a few float32 subnormals divides to 0, which no rounding brings back up; such a
    span gets fp16's smallest step instead, so that a group whose values differ never has a
    zero scale (a zero scale means "every value equal").
    """
    scale = fp16_toward(span / steps, float("inf"))
    return torch.where((span > 0) & (scale == 0), torch.full_like(scale, FP16_TINIEST), scale)


def fp16_toward(x: torch.Tensor, direction: float) -> torch.Tensor:
    """``x`` (float32) rounded to fp16 toward ``direction`` (+inf: up, -inf: down), not to nearest."""
    nearest = x.half()
    wrong_side = (nearest.float() < x) if direction > 0 else (nearest.float() > x)
    step = torch.nextafter(nearest, torch.full_like(nearest, direction))
    return torch.where(wrong_side, step, nearest)


def finite_in(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``values`` in ``dtype``, clamped to its largest finite magnitude first.

    A scale rounded up to fp16 can read the top code back a little beyond the group's maximum:
    at fp16's limit (±65504) that is past the largest fp16 and would become inf. Every input
    was finite in ``dtype``, so the clamp only moves a value toward the one it stands for: the
    error bound still holds, and dequantize is finite for every finite input.
    """
    limit = torch.finfo(dtype).max
    return values.clamp_(-limit, limit).to(dtype)


def grouped(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """(..., length) -> (..., num_groups, group_size), the last group padded with its last value.

    Replicating the last value leaves the last group's minimum and maximum unchanged.
    """
    *lead, length = x.shape
    pad = -length % group_size
    if pad and x.numel():
        x = F.pad(x.reshape(-1, 1, length), (0, pad), mode="replicate").view(*lead, length + pad)
    elif pad:  # no vectors (a leading dim of 0): nothing to replicate
        x = x.new_zeros(*lead, length + pad)
    return x.view(*lead, (length + pad) // group_size, group_size)  # the count given: -1 fails on 0 values


@dataclass(frozen=True)
class QuantizedTensor:
    """A float tensor stored as packed ``bits``-bit codes with an fp16 scale and zero point per group."""

    data: torch.Tensor  # uint8 (..., ceil(length * bits / 8)): the packed codes of each vector
    scale: torch.Tensor  # float16 (..., num_groups): s of each group
    zero: torch.Tensor  # float16 (..., num_groups): z of each group (its minimum, rounded down)
    bits: int  # width of one code: 2, 4 or 8
    group_size: int  # consecutive values along the last dim sharing one scale and zero point
    length: int  # values per vector (the last dim of the original tensor)
    dtype: torch.dtype  # dtype of the original tensor, which dequantize returns

    @property
    def num_bytes(self) -> int:
        """Bytes really held: packed codes, scales and zero points."""
        return sum(t.numel() * t.element_size() for t in (self.data, self.scale, self.zero))

    def codes(self) -> torch.Tensor:
        """The unpacked codes, uint8 (..., length)."""
        return unpack_codes(self.data, self.bits, self.length)

    def dequantize(self) -> torch.Tensor:
        """``code * scale + zero`` per value, in float32 arithmetic, returned in the original dtype."""
        codes = grouped(self.codes(), self.group_size).float()  # (..., groups, group_size)
        values = codes * self.scale.float()[..., None] + self.zero.float()[..., None]
        return finite_in(values.flatten(-2)[..., : self.length], self.dtype)


def quantize_minmax(x: torch.Tensor, bits: int, group_size: int = 32) -> QuantizedTensor:
    """Quantize ``x`` (..., length) in groups of ``group_size`` values along its last dim (see the module)."""
    check_floats(x)
    check_group_size(group_size)
    bits = 8 // check_bits(bits)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise KVLibError(f"x must have a non-empty last dim, not shape {tuple(x.shape)}")
    group_size = check_group_size(group_size, x.shape[-1])
    groups = grouped(x.float(), group_size)  # (..., num_groups, group_size)
    zero = fp16_toward(groups.amin(dim=-1), float("-inf"))  # (..., num_groups), <= every value
    top = 2**bits - 1
    span = groups.amax(dim=-1) - zero.float()  # (..., num_groups), >= 0
    scale = fp16_scale(span, top)  # rounded up: (x - z) / s <= top
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale).float()  # equal values: codes 0
    codes = ((groups - zero.float()[..., None]) / divisor[..., None]).round().clamp_(0, top)
    codes = codes.to(torch.uint8).flatten(-2)[..., : x.shape[-1]]  # (..., length)
    return QuantizedTensor(pack_checked(codes, bits), scale, zero, bits, group_size, x.shape[-1], x.dtype)
