"""The fused paged decode kernel on a GPU, in Triton (chapters 2 and 3, when a CUDA device runs them).

The same contract as :mod:`kvlib.kernels.numba_decode`: one new query token per sequence
attends over its keys and values read in place through its block table, the query heads of a
KV group sharing each K/V tile, with an online softmax in float32. One program runs per
(sequence, KV head, split); it walks its range of the sequence in tiles of ``BLOCK_N``
positions, finding each position's block in the table (any block size works, 1 included),
and multiplies the group's queries (padded to 16 rows, the smallest ``tl.dot``) with the
tile in IEEE float32 (no TF32: the reference is float32). With several splits each program
writes a partial (max, sum, acc) and :func:`merge_partials` combines them by log-sum-exp.

Triton ships with PyTorch's CUDA wheels but not with its CPU wheels: this module imports
without it, and :func:`triton_available` says whether the kernel can run on a GPU here. With
``TRITON_INTERPRET=1`` set before this module is imported, Triton runs the same kernel on CPU
tensors in its interpreter (numpy, slow): ``make triton-interpreted`` checks it so on machines
without a GPU (:func:`triton_runs_on`).
"""

from __future__ import annotations

import math
import os

import torch

from kvlib import KVLibError

try:  # not installed with CPU-only PyTorch
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the platform
    triton = None

BLOCK_N = 16  # positions per tile: the smallest tl.dot dimension


def triton_available() -> bool:
    """Can the Triton kernel run here (Triton importable and a CUDA device present)?"""
    return triton is not None and torch.cuda.is_available()


def triton_interpreting() -> bool:
    """Does Triton run kernels in its interpreter (``TRITON_INTERPRET=1``, read when Triton decorates
    them, so it must be set before this module is imported)?"""
    return triton is not None and os.environ.get("TRITON_INTERPRET") == "1"


def triton_runs_on(device: torch.device) -> bool:
    """Can the kernel run on tensors of ``device``: CUDA ones on a GPU, CPU ones in the interpreter?"""
    if device.type == "cuda":
        return triton_available()
    return device.type == "cpu" and triton_interpreting()


if triton is not None:

    @triton.jit
    def _decode_kernel(
        q_ptr,  # (batch, num_heads, head_dim) float32, contiguous
        k_ptr,  # (num_blocks, block_size, num_kv_heads, head_dim), last dimension contiguous
        v_ptr,
        table_ptr,  # (batch, max_blocks) int32 or int64
        lens_ptr,  # (batch,)
        out_ptr,  # (batch, num_heads, head_dim) float32, or the partial acc (batch, heads, splits, hd)
        part_m_ptr,  # (batch, num_heads, splits) float32 (unused with one split)
        part_l_ptr,
        stride_kb,
        stride_kt,
        stride_kh,
        stride_table,
        block_size,
        num_heads,
        head_dim,
        scale,
        tokens_per_split,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_PAD: tl.constexpr,
        NUM_SPLITS: tl.constexpr,
        TILE: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(lens_ptr + seq).to(tl.int32)
        first = split * tokens_per_split
        end = tl.minimum(first + tokens_per_split, seq_len)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, HEAD_PAD)
        heads = kv_head * GROUP + g  # the query heads of this KV head
        g_ok = g < GROUP
        d_ok = d < head_dim
        q = tl.load(
            q_ptr + (seq * num_heads + heads)[:, None] * head_dim + d[None, :],
            mask=g_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
        for start in range(first, end, TILE):
            pos = start + tl.arange(0, TILE)
            valid = pos < end
            block = tl.load(table_ptr + seq * stride_table + pos // block_size, mask=valid, other=0)
            row = block.to(tl.int64) * stride_kb + (pos % block_size) * stride_kt + kv_head * stride_kh
            tile_ok = valid[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + row[:, None] + d[None, :], mask=tile_ok, other=0.0).to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (GROUP_PAD, TILE)
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + row[:, None] + d[None, :], mask=tile_ok, other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            m_i = m_new
        out_mask = g_ok[:, None] & d_ok[None, :]
        if NUM_SPLITS == 1:
            out = acc / l_i[:, None]
            tl.store(out_ptr + (seq * num_heads + heads)[:, None] * head_dim + d[None, :], out, mask=out_mask)
        else:
            part = (seq * num_heads + heads) * NUM_SPLITS + split  # (GROUP_PAD,) row of the partials
            tl.store(part_m_ptr + part, m_i, mask=g_ok)
            tl.store(part_l_ptr + part, l_i, mask=g_ok)
            tl.store(out_ptr + part[:, None] * head_dim + d[None, :], acc, mask=out_mask)


def merge_partials(part_m: torch.Tensor, part_l: torch.Tensor, part_acc: torch.Tensor) -> torch.Tensor:
    """Log-sum-exp merge of the splits: (batch, heads, splits) max and sum, (batch, heads, splits,
    head_dim) acc -> (batch, heads, head_dim). Empty splits (sum 0, max -inf) weigh nothing."""
    top = part_m.amax(dim=-1, keepdim=True)  # (batch, heads, 1)
    weight = torch.where(part_l > 0, torch.exp(part_m - top), torch.zeros_like(part_m))
    total = (part_l * weight).sum(dim=-1, keepdim=True)  # (batch, heads, 1)
    return (part_acc * weight[..., None]).sum(dim=-2) / total


def triton_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_splits: int,
    max_seq_len: int,
) -> torch.Tensor:
    """Run the kernel on checked CUDA tensors, or CPU ones in the interpreter (see
    :func:`kvlib.kernels.dispatch.decode_attention`).

    q: (batch, num_heads, head_dim); k_cache, v_cache: (num_blocks, block_size, num_kv_heads,
    head_dim); block_tables: (batch, max_blocks); seq_lens: (batch,); max_seq_len: the longest
    sequence (sizes the splits). Returns float32 (batch, num_heads, head_dim).
    """
    if not triton_runs_on(q.device):
        raise KVLibError(
            f"the triton kernel needs Triton and a CUDA device (or TRITON_INTERPRET=1 for CPU tensors), "
            f"not {q.device}; use kernel='torch' or 'numba'"
        )
    q32 = q.to(torch.float32).contiguous()
    batch, num_heads, head_dim = q32.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    per_split = math.ceil(max(1, max_seq_len) / num_splits / BLOCK_N) * BLOCK_N
    out = torch.empty_like(q32)
    if num_splits > 1:
        part_m = torch.empty(batch, num_heads, num_splits, device=q.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
        target = torch.empty(batch, num_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
    else:
        part_m = part_l = target = out
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        q32,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        target,
        part_m,
        part_l,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        block_size,
        num_heads,
        head_dim,
        1.0 / math.sqrt(head_dim),
        per_split,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_PAD=max(16, triton.next_power_of_2(head_dim)),
        NUM_SPLITS=num_splits,
        TILE=BLOCK_N,
    )
    return out if num_splits == 1 else merge_partials(part_m, part_l, target)
