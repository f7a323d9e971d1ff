"""fp8 e4m3 storage with one fp16 scale per group of a token's vector (the quality chapter).

``torch.float8_e4m3fn`` (4 exponent bits, 3 mantissa bits, largest value 448, no infinity)
is the fp8 format of vLLM's ``kv_cache_dtype="fp8"`` (``fp8_e4m3``). vLLM scales each layer's
cache by one per-tensor ``k_scale`` / ``v_scale`` (calibrated, or 1.0; see
``vllm/attention/layer.py``, v0.6). A cache that grows token by token cannot know the tensor's
maximum in advance, so we scale **per token**: each group of ``group_size`` values of a
vector (default: the whole vector, one scale per token and head) is divided by
``s = max|x| / 448`` (fp16, rounded up so that nothing overflows 448) and stored in fp8.

Why the relative error is at most 2**-4 per value: with 3 mantissa bits, rounding to nearest
moves a normal fp8 number by at most half a step, 2**-4 of its leading power of two; values
below fp8's smallest normal (2**-6 after scaling) lose relative precision and are off by at
most half the subnormal step, 2**-10 times the scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.quant.minmax import check_floats, check_group_size, finite_in, fp16_scale, grouped

FP8_DTYPE = torch.float8_e4m3fn  # the storage dtype: e4m3, finite only
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448.0


@dataclass(frozen=True)
class Fp8Tensor:
    """A float tensor stored in fp8 e4m3 with an fp16 scale per group of its last dim."""

    data: torch.Tensor  # float8_e4m3fn (..., length): x / scale of each value
    scale: torch.Tensor  # float16 (..., num_groups): max|x| / 448 of each group, rounded up
    group_size: int  # consecutive values along the last dim sharing one scale
    dtype: torch.dtype  # dtype of the original tensor, which dequantize returns

    @property
    def num_bytes(self) -> int:
        """Bytes really held: one per value plus the fp16 scales."""
        return sum(t.numel() * t.element_size() for t in (self.data, self.scale))

    def dequantize(self) -> torch.Tensor:
        """``data * scale`` in float32, returned in the original dtype."""
        length = self.data.shape[-1]
        values = grouped(self.data.float(), self.group_size) * self.scale.float()[..., None]
        return finite_in(values.flatten(-2)[..., :length], self.dtype)


def quantize_fp8(x: torch.Tensor, group_size: int | None = None) -> Fp8Tensor:
    """Store ``x`` (..., length) in fp8 e4m3, one scale per ``group_size`` values (None: per vector)."""
    check_floats(x)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise KVLibError(f"x must have a non-empty last dim, not shape {tuple(x.shape)}")
    length = x.shape[-1]
    group_size = check_group_size(length if group_size is None else group_size, length)
    groups = grouped(x.float(), group_size)  # (..., num_groups, group_size)
    scale = fp16_scale(groups.abs().amax(dim=-1), FP8_MAX)  # (..., num_groups), rounded up
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale).float()  # all-zero groups stay 0
    scaled = (groups / divisor[..., None]).clamp_(-FP8_MAX, FP8_MAX)  # the clamp only guards rounding
    data = scaled.to(FP8_DTYPE).flatten(-2)[..., :length]
    return Fp8Tensor(data, scale, group_size, x.dtype)
