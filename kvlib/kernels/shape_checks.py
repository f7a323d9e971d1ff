"""The shape checks every attention kernel path makes, in one copy (chapters 2 and 3).

The PyTorch gather reference, :func:`~kvlib.kernels.dispatch.decode_attention` (numba, Triton)
and the numba kernel bound to a cache's pools (:class:`~kvlib.kernels.pool_decoder.PoolDecoder`)
all read q's heads against the cache's KV heads and q's batch against the block tables. A
compiled kernel trusts these numbers: one head too few gives NaN, a head count that no KV head
count divides gives numbers off the reference, a batch larger than the tables reads outside them
and kills the process. So each path calls :func:`check_heads` and :func:`check_batch` before it runs.
"""

from __future__ import annotations

from kvlib import KVLibError


def check_heads(num_heads: int, head_dim: int, num_kv_heads: int, cache_head_dim: int) -> None:
    """q's ``num_heads`` of ``head_dim`` must be a whole number of groups of the cache's
    ``num_kv_heads`` of ``cache_head_dim`` (grouped-query attention), else a KVLibError."""
    if num_heads < 1 or num_heads % num_kv_heads or head_dim != cache_head_dim:
        raise KVLibError(
            f"q has {num_heads} heads of {head_dim}; the cache {num_kv_heads} KV heads of {cache_head_dim}: "
            f"q's heads must be a multiple of {num_kv_heads} and its head_dim {cache_head_dim}"
        )


def check_batch(batch: int, num_tables: int, num_lens: int) -> None:
    """q's ``batch`` must equal the block tables' rows and the sequence lengths, else a KVLibError."""
    if not batch == num_tables == num_lens:
        raise KVLibError(
            f"batch sizes differ: q {batch}, block_tables {num_tables}, seq_lens {num_lens}; "
            "they must be equal"
        )
