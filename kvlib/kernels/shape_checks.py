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


def check_step(layer, num_layers: int, q, k, v, kv_shape: tuple[int, int, int, int]) -> None:
    """The arguments of a cache's ``attend(layer, q, k, v)``, checked once per layer: ``layer`` in
    0..num_layers - 1 (not Python's -1 for the last), k and v exactly ``kv_shape`` (batch,
    num_kv_heads, num_new, head_dim) for the prepared step, q (batch, heads, num_new, head_dim)
    with heads a multiple of the KV heads (:func:`check_heads`); else a KVLibError."""
    from kvlib.checks import require_int

    if kv_shape[2] == 0:
        raise KVLibError("attend before prepare: call cache.prepare(num_new) before each step")
    require_int(layer, "layer", 0, num_layers - 1)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not hasattr(tensor, "shape") or len(tensor.shape) != 4:
            shape = tuple(tensor.shape) if hasattr(tensor, "shape") else type(tensor).__name__
            raise KVLibError(f"{name} must be a 4-d tensor (batch, heads, num_new, head_dim), not {shape}")
    for name, tensor in (("k", k), ("v", v)):
        if tuple(tensor.shape) != kv_shape:
            raise KVLibError(f"{name} must be {kv_shape} after prepare, not {tuple(tensor.shape)}")
    batch, _, num_new, _ = kv_shape
    if q.shape[0] != batch or q.shape[2] != num_new:
        raise KVLibError(f"q must be ({batch}, num_heads, {num_new}, head_dim), not {tuple(q.shape)}")
    check_heads(q.shape[1], q.shape[3], kv_shape[1], kv_shape[3])
    if q.dtype != k.dtype or v.dtype != k.dtype:
        raise KVLibError(f"q, k and v must share one dtype, not {q.dtype}, {k.dtype}, {v.dtype}")
