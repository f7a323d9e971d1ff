"""The numba decode kernel bound to one cache's K/V pools: the lean decode step's attention (chapter 1).

:func:`~kvlib.kernels.dispatch.decode_attention` checks its inputs and converts every tensor to
a numpy view before it calls the compiled kernel: tens of microseconds per call, as much as the
attention of a short context itself, and the checks dispatch operators that allocate (the
longest length, the largest block id). A cache that built its block tables itself needs
neither. :class:`PoolDecoder` holds numpy views of the cache's pools, made once, and of the
other tensors it is handed, made when it first sees them (it keeps them alive, so a view never
outlives its memory); a decode step then copies q into a buffer of its own and calls
:func:`kvlib.kernels.numba_decode.launch`: no operator allocates. The contiguous cache of
chapter 1 (one block per sequence, an identity block table) and the paged cache of chapters 3
and 4 both decode through it on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvlib import KVLibError
from kvlib.kernels.dispatch import choose_num_splits, num_workers, numba_module, work_items
from kvlib.kernels.shape_checks import check_batch, check_heads

MAX_VIEWS = 64  # numpy views of handed tensors kept (a paged step's block tables change width)


def pool_decoder_runs(device: torch.device | str | None, dtype: torch.dtype) -> bool:
    """Can a :class:`PoolDecoder` serve pools on ``device`` in ``dtype`` (a CPU, numba importable)?"""
    from kvlib.kernels.dispatch import CACHE_DTYPES

    return (
        torch.device(device or "cpu").type == "cpu" and dtype in CACHE_DTYPES and numba_module() is not None
    )


class PoolDecoder:
    """Decode attention over the K/V pools of one cache, one layer at a time, into given buffers.

    k_pools, v_pools: per layer a contiguous (num_blocks, block_size, num_kv_heads, head_dim) CPU
    tensor, float32 or 16-bit; their numpy views are made here once.
    """

    def __init__(self, k_pools: Sequence[torch.Tensor], v_pools: Sequence[torch.Tensor]):
        self.kernel = numba_module()  # kvlib.kernels.numba_decode
        self.fmt = self.kernel.FORMATS[k_pools[0].dtype]  # how the kernel reads the stored K/V
        self.k = [self.kernel.as_numpy(pool) for pool in k_pools]  # per layer, views of the pools
        self.v = [self.kernel.as_numpy(pool) for pool in v_pools]
        self.q = torch.empty(0)  # (batch, heads, head_dim) float32: q copied contiguous
        self._q_view = np.empty((0, 0, 0), np.float32)
        self._views: dict[tuple, np.ndarray] = {}  # (data_ptr, shape, strides, dtype) -> numpy view

    def view(self, tensor: torch.Tensor) -> np.ndarray:
        """A numpy view of a contiguous CPU tensor, made on first sight and kept with the tensor."""
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        found = self._views.get(key)
        if found is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            found = self._views[key] = tensor.numpy()
        return found

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        longest: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q (batch, heads, 1, head_dim) float32 over ``layer``'s pools through block_tables (batch,
        max_blocks) int64 and seq_lens (batch,) int64, both contiguous; ``longest`` is the largest
        of seq_lens. Returns (batch, heads, 1, head_dim): ``out`` (contiguous float32) or a new tensor.
        """
        k_pool = self.k[layer]  # (num_blocks, block_size, num_kv_heads, head_dim)
        if q.dim() != 4 or q.shape[2] != 1:
            raise KVLibError(f"q must be (batch, num_heads, 1, head_dim), not {tuple(q.shape)}")
        check_heads(q.shape[1], q.shape[3], k_pool.shape[2], k_pool.shape[3])
        check_batch(q.shape[0], block_tables.shape[0], seq_lens.shape[0])
        shape = q.shape[:2] + q.shape[3:]  # (batch, heads, head_dim)
        if self.q.shape[1:] != shape[1:] or self.q.shape[0] < shape[0]:  # a larger batch: grow
            self.q = torch.empty(shape, device=q.device)
            self._q_view = self.q.numpy()
        batch = shape[0]
        staged = self.q if self.q.shape[0] == batch else self.q[:batch]
        staged.copy_(q[:, :, 0])  # q and k were rotated together: q's rows may be strided
        if out is None:  # a tensor of the caller's own: no view of it to keep
            out = torch.empty(q.shape, device=q.device)
            out_view = out.numpy().reshape(shape)
        else:
            out_view = self.view(out).reshape(shape)
        num_kv_heads = k_pool.shape[2]
        num_splits = choose_num_splits(
            work_items("numba", batch, num_kv_heads), longest, num_workers(q.device)
        )
        self.kernel.launch(
            self._q_view[:batch],
            k_pool,
            self.v[layer],
            self.view(block_tables),
            self.view(seq_lens),
            self.fmt,
            num_splits,
            out_view,
        )
        return out
