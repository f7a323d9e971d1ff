"""Random decode cases for the kernel tests and the tolerance they are compared with.

Tolerance: a decode output is a convex combination of V rows (weights >= 0, summing to 1), so
its error relative to max |V| is bounded by the weights' relative error plus the rounding of
the weighted sum. Every kernel works in float32 (epsilon 6e-8): the scores are dot products of
head_dim terms, the weights exp(score - max) of such scores, the sums run over at most a few
hundred keys, and the kernels sum in another order than the reference (vectorised dot
products, blockwise online rescaling, split-K merges). Each of these costs a few epsilons times
the logarithm or square root of the number of terms, far below 1e-5 for the sizes tested
(observed about 3e-7). 16-bit storage is compared with the reference run on the same 16-bit
values upcast to float32: the conversion is exact, so the same bound holds.
"""

import torch

from kvlib.chapters.ch03_paged_attention.kernel_overhead import random_decode_case
from kvlib.kernels.torch_gather import paged_attention

RTOL = 1e-5  # of the reference's largest magnitude


def decode_case(lengths, block_size, num_kv_heads, group, head_dim=16, dtype=torch.float32, seed=0):
    """q (batch, heads, hd) float32; caches in ``dtype``; shuffled block tables; lengths."""
    case = random_decode_case(
        lengths, block_size, num_kv_heads * group, num_kv_heads, head_dim=head_dim, seed=seed
    )
    return case.q[:, :, 0], case.k_cache.to(dtype), case.v_cache.to(dtype), case.block_tables, case.seq_lens


def reference(q, k_cache, v_cache, block_tables, seq_lens):
    """The PyTorch gather kernel on the same values in float32: (batch, heads, head_dim)."""
    return paged_attention(q[:, :, None].float(), k_cache.float(), v_cache.float(), block_tables, seq_lens)[
        :, :, 0
    ]


def relative_error(out, ref) -> float:
    """Largest difference, relative to the reference's largest magnitude."""
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()
