"""Attention kernels over a paged KV cache: the PyTorch reference and the fused decode kernels
(chapter 2's roofline of decode attention, chapter 3's cost of paging).

- ``torch_gather``: the readable reference and test oracle: gather each sequence's blocks
  through its block table into one contiguous copy, then attend (:func:`paged_attention`);
  prefills of several tokens per sequence run on it.
"""

from kvlib.kernels.torch_gather import (
    QUERY_CHUNK,
    GatherBuffer,
    KeyMask,
    attend_gathered,
    gather_blocks,
    key_mask,
    paged_attention,
    visibility_bias,
)

__all__ = [
    "GatherBuffer",
    "KeyMask",
    "QUERY_CHUNK",
    "attend_gathered",
    "gather_blocks",
    "key_mask",
    "paged_attention",
    "visibility_bias",
]
