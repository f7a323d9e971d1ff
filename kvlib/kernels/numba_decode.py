"""The fused paged decode kernel on the CPU, in numba (chapter 2's roofline, chapter 3's paging cost).

One new query token per sequence attends over the sequence's keys and values, read *in place*
from the blocks its block table names: no gather copy (what :mod:`kvlib.kernels.torch_gather`
makes). A work item is one sequence, or one split of its blocks, and it walks its blocks in
table order (block-outer). Within a block it reads the keys token by token, every KV head of
a token side by side, which is the order of the block's memory in the cache's ``(num_blocks,
block_size, num_kv_heads, head_dim)`` layout, so the hardware prefetcher can stream it. Each K
row and each V row is read once for all the query heads of its group (GQA/MQA read a KV head
once per group, not once per query head), and an online softmax keeps a running maximum and
sum per query head, so a block's probabilities are used at once and never stored for the
whole context. While it computes a block, the kernel prefetches the next block the table
names (:func:`prefetch_rows`), which no hardware prefetcher can guess.

Why not one work item per (sequence, KV head)? Then each item reads one head's rows, which
lie ``num_kv_heads x head_dim`` elements apart (16 KiB for 32 heads of 128 float32): the
prefetcher cannot follow that, and such a kernel read at about a third of the DRAM rate.

Two layouts of the arithmetic, chosen by the group size (query heads per KV head):

- **head_dim in the vector lanes** (:func:`attend_blocks`, here): every score is a dot
  product vectorised along ``head_dim``, four keys and two query heads at a time. It ends in a
  horizontal sum per score, a cost memory hides where the group is small (MHA, groups of 2
  or 4: at most 2 FLOPs per byte in float32);
- **query heads in the vector lanes** (:func:`kvlib.kernels.numba_lanes.attend_lanes`) when
  each group fills whole vectors of eight (GQA with groups of 8, MQA): explicit SIMD, no
  horizontal sums, so the arithmetic keeps up as the group carries the step towards the
  ridge point of chapter 2's roofline.

Split-K (Flash-Decoding): when the batch has fewer sequences than there are threads, each
sequence's blocks are split into ``num_splits`` ranges, each writing a partial (max, sum,
weighted sum of V) that a second, small pass merges by log-sum-exp (:func:`merge_splits`).

Arithmetic is float32. The block loops are compiled with ``fastmath={"reassoc", "contract"}``
(:data:`SUMS_IN_ANY_ORDER`): LLVM may reorder the sums of a dot product and of a block's
weights to vectorise them and may fuse multiply-adds; without it the kernel runs several times
slower. The cost is rounding in another order than the reference's, a few float32 epsilons
(``tests/kernels/cases.py`` argues the 1e-5 tolerance of the tests). numba has no float16 on
the CPU, so float16 and bfloat16 storage arrive as ``uint16`` arrays and are converted block
by block with bit operations and an LLVM bitcast (:func:`bits_to_float32`). Compiled code is
cached on disk (:func:`~kvlib.kernels.numba_setup.cached_njit`, under a fingerprint of every
kernel source); :func:`~kvlib.kernels.numba_setup.jit_seconds` reports what the first call of
each storage type cost in this process (compilation, about half a minute per storage type, or
loading the cache).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from kvlib.kernels.numba_lanes import attend_lanes
from kvlib.kernels.numba_ops import (
    BFLOAT16,
    FLOAT16,
    FLOAT32,
    block_rows,
    exp_nonpositive,
    prefetch_rows,
)
from kvlib.kernels.numba_setup import cached_njit, timed_first_call, use_numba_threads
from kvlib.kernels.numba_simd import LANES

FORMATS = {torch.float32: FLOAT32, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16}
# LLVM may reassociate float32 sums (vectorise a dot product over head_dim, a sum over a
# block's tokens) and fuse multiply-adds; never assume no inf/NaN (the running max starts at -inf)
SUMS_IN_ANY_ORDER = {"reassoc", "contract"}
NO_PARTIALS = (
    np.empty((1, 1, 1), np.float32),
    np.empty((1, 1, 1), np.float32),
    np.empty((1, 1, 1, 1), np.float32),
)
TOKENS_AT_ONCE = 4  # K and V rows combined per pass over a row of q or acc: 4 partial sums in flight


@njit(inline="always")
def rescale(scores, num, g, m, denom, acc):
    """Online softmax for query head ``g`` after one block: raise its running max to the block's
    largest score (rescaling the sum and acc taken under the old one), then turn the block's
    scores into exp(score - max) and add them to the sum."""
    new_m = m[g]
    for t in range(num):
        new_m = max(new_m, scores[g, t])
    if new_m > m[g]:  # exp(m - new_m) is 1 otherwise: skip multiplying by it
        alpha = exp_nonpositive(m[g] - new_m)
        denom[g] *= alpha
        for d in range(acc.shape[1]):
            acc[g, d] *= alpha
        m[g] = new_m
    total = np.float32(0.0)  # a local sum: the loop vectorises (denom[g] might alias scores)
    for t in range(num):
        weight = exp_nonpositive(scores[g, t] - new_m)
        scores[g, t] = weight
        total += weight
    denom[g] += total


@njit(inline="always")
def dot(q, qh, rows, block, t, h):
    """q[qh] . rows[block, t, h]: one query head's score of one key, unscaled."""
    total = np.float32(0.0)
    for d in range(q.shape[1]):
        total += q[qh, d] * rows[block, t, h, d]
    return total


@njit(inline="always")
def block_scores(q, keys, block, num, scale, scores, cache, upcoming):
    """scores[qh, t] = q[qh] . K[t] * scale for the ``num`` keys of a block, every query head.

    q: (num_heads, head_dim); keys: (num_blocks, block_size, num_kv_heads, head_dim);
    scores: (num_heads, block_size). Four keys and two query heads of a group per pass over
    head_dim: each loaded element serves four or two products, and eight independent sums keep
    the multiply-add units busy. The keys are walked token by token, the KV heads of a token
    side by side: the block's memory in order. ``cache``, ``upcoming``: see :func:`prefetch_rows`.
    """
    num_heads = q.shape[0]
    num_kv_heads = keys.shape[2]
    group = num_heads // num_kv_heads
    t = 0
    while t + TOKENS_AT_ONCE <= num:
        for h in range(num_kv_heads):
            prefetch_rows(cache, upcoming, t, h, TOKENS_AT_ONCE)
            qh = h * group
            while qh + 2 <= (h + 1) * group:  # two query heads of KV head h at a time
                a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
                for d in range(q.shape[1]):
                    k0, k1 = keys[block, t, h, d], keys[block, t + 1, h, d]
                    k2, k3 = keys[block, t + 2, h, d], keys[block, t + 3, h, d]
                    x, y = q[qh, d], q[qh + 1, d]
                    a0, a1, a2, a3 = a0 + x * k0, a1 + x * k1, a2 + x * k2, a3 + x * k3
                    b0, b1, b2, b3 = b0 + y * k0, b1 + y * k1, b2 + y * k2, b3 + y * k3
                scores[qh, t], scores[qh, t + 1] = a0 * scale, a1 * scale
                scores[qh, t + 2], scores[qh, t + 3] = a2 * scale, a3 * scale
                scores[qh + 1, t], scores[qh + 1, t + 1] = b0 * scale, b1 * scale
                scores[qh + 1, t + 2], scores[qh + 1, t + 3] = b2 * scale, b3 * scale
                qh += 2
            if qh < (h + 1) * group:  # an odd group (1 for MHA): the last head alone
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for d in range(q.shape[1]):
                    x = q[qh, d]
                    a0 += x * keys[block, t, h, d]
                    a1 += x * keys[block, t + 1, h, d]
                    a2 += x * keys[block, t + 2, h, d]
                    a3 += x * keys[block, t + 3, h, d]
                scores[qh, t], scores[qh, t + 1] = a0 * scale, a1 * scale
                scores[qh, t + 2], scores[qh, t + 3] = a2 * scale, a3 * scale
        t += TOKENS_AT_ONCE
    for r in range(t, num):  # the last block's remainder, token by token
        for h in range(num_kv_heads):
            for qh in range(h * group, (h + 1) * group):
                scores[qh, r] = dot(q, qh, keys, block, r, h) * scale


@njit(inline="always")
def add_values(values, block, num, weights, acc, cache, upcoming):
    """acc[qh] += sum over the block's ``num`` tokens of weights[qh, t] * V[t], every query head.

    values: (num_blocks, block_size, num_kv_heads, head_dim); weights: (num_heads, block_size);
    acc: (num_heads, head_dim). Four tokens per pass over an acc row (one load and one store of
    it per four V rows), two query heads of a group per pass over the V rows (each V element
    loaded once for both).
    """
    num_heads, head_dim = acc.shape
    num_kv_heads = values.shape[2]
    group = num_heads // num_kv_heads
    t = 0
    while t + TOKENS_AT_ONCE <= num:
        for h in range(num_kv_heads):
            prefetch_rows(cache, upcoming, t, h, TOKENS_AT_ONCE)
            qh = h * group
            while qh + 2 <= (h + 1) * group:  # two query heads at a time
                a0, a1, a2, a3 = weights[qh, t], weights[qh, t + 1], weights[qh, t + 2], weights[qh, t + 3]
                b0, b1 = weights[qh + 1, t], weights[qh + 1, t + 1]
                b2, b3 = weights[qh + 1, t + 2], weights[qh + 1, t + 3]
                for d in range(head_dim):
                    v0, v1 = values[block, t, h, d], values[block, t + 1, h, d]
                    v2, v3 = values[block, t + 2, h, d], values[block, t + 3, h, d]
                    acc[qh, d] += (a0 * v0 + a1 * v1) + (a2 * v2 + a3 * v3)
                    acc[qh + 1, d] += (b0 * v0 + b1 * v1) + (b2 * v2 + b3 * v3)
                qh += 2
            if qh < (h + 1) * group:  # an odd group (1 for MHA): the last head alone
                a0, a1, a2, a3 = weights[qh, t], weights[qh, t + 1], weights[qh, t + 2], weights[qh, t + 3]
                for d in range(head_dim):
                    acc[qh, d] += (a0 * values[block, t, h, d] + a1 * values[block, t + 1, h, d]) + (
                        a2 * values[block, t + 2, h, d] + a3 * values[block, t + 3, h, d]
                    )
        t += TOKENS_AT_ONCE
    for r in range(t, num):  # the last block's remainder, token by token
        for h in range(num_kv_heads):
            for qh in range(h * group, (h + 1) * group):
                for d in range(head_dim):
                    acc[qh, d] += weights[qh, r] * values[block, r, h, d]


@cached_njit(fastmath=SUMS_IN_ANY_ORDER)
def attend_blocks(q, k, v, table, first_block, end_block, seq_len, fmt, m, denom, acc, scores, scratch):
    """Online softmax of one sequence's queries over its blocks ``[first_block, end_block)``.

    q: (num_heads, head_dim) float32; k, v: (num_blocks, block_size, num_kv_heads, head_dim)
    float32 or uint16 (``fmt``); table: (max_blocks,) the sequence's block table.
    m, denom: (num_heads,) running max and sum of exp(score - max) (the softmax's denominator);
    acc: (num_heads, head_dim), the sum of exp(score - max) * V rows, not yet divided by
    ``denom``. All three are set here. scores: (num_heads, block_size) and scratch (1,
    block_size, num_kv_heads, head_dim) are work space.
    """
    num_heads = q.shape[0]
    block_size = k.shape[1]
    scale = np.float32(1.0 / np.sqrt(np.float64(q.shape[1])))
    m[:] = -np.inf
    denom[:] = 0.0
    acc[:] = 0.0
    for j in range(first_block, end_block):
        block = table[j]  # one table read per block, not per token
        num = min(block_size, seq_len - j * block_size)  # tokens of this block that exist
        upcoming = table[j + 1] if j + 1 < end_block else -1  # prefetched meanwhile
        keys, at = block_rows(k, block, num, fmt, scratch)
        block_scores(q, keys, at, num, scale, scores, k, upcoming)
        for qh in range(num_heads):
            rescale(scores, num, qh, m, denom, acc)
        values, at = block_rows(v, block, num, fmt, scratch)  # K's rows are no longer needed
        add_values(values, at, num, scores, acc, v, upcoming)


@cached_njit(parallel=True, fastmath=False)
def decode_kernel(q, k, v, tables, seq_lens, fmt, num_splits, out, part_m, part_l, part_acc):
    """Decode attention of a batch, parallel over (sequence, split).

    q, out: (batch, num_heads, head_dim) float32; k, v: (num_blocks, block_size, num_kv_heads,
    head_dim) float32 or uint16 (``fmt``); tables: (batch, max_blocks) int64; seq_lens:
    (batch,) int64. With one split the result goes to ``out``; with more, each split's
    (max, sum, acc) goes to part_m, part_l (batch, num_heads, num_splits) and part_acc
    (batch, num_heads, num_splits, head_dim), for :func:`merge_splits`.
    """
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k.shape[1], k.shape[2]
    staged = fmt != FLOAT32  # 16-bit storage is converted block by block, into scratch
    heads_in_lanes = (num_heads // num_kv_heads) % LANES == 0  # each group fills whole vectors
    for item in prange(batch * num_splits):
        seq, split = item // num_splits, item % num_splits
        num_blocks = (seq_lens[seq] + block_size - 1) // block_size
        first = split * num_blocks // num_splits  # balanced ranges; empty when blocks < splits
        end = (split + 1) * num_blocks // num_splits
        m = np.empty(num_heads, dtype=np.float32)
        denom = np.empty(num_heads, dtype=np.float32)
        acc = np.empty((num_heads, head_dim), dtype=np.float32)
        scratch = np.empty((1, block_size if staged else 1, num_kv_heads, head_dim), dtype=np.float32)
        if heads_in_lanes:
            attend_lanes(q[seq], k, v, tables[seq], first, end, seq_lens[seq], fmt, m, denom, acc, scratch)
        else:
            scores = np.empty((num_heads, block_size), dtype=np.float32)
            attend_blocks(
                q[seq], k, v, tables[seq], first, end, seq_lens[seq], fmt, m, denom, acc, scores, scratch
            )
        if num_splits == 1:
            for qh in range(num_heads):
                for d in range(head_dim):
                    out[seq, qh, d] = acc[qh, d] / denom[qh]
        else:
            part_m[seq, :, split] = m
            part_l[seq, :, split] = denom
            part_acc[seq, :, split] = acc


@cached_njit(parallel=True, fastmath=False)
def merge_splits(part_m, part_l, part_acc, out):
    """Merge the splits of each (sequence, query head) by log-sum-exp into ``out`` (batch, heads, hd).

    Each split's sum and acc were taken under its own max; rescaled to the largest max they
    add up to what one pass over all blocks gives. Empty splits (max -inf) weigh 0.
    """
    batch, num_heads, num_splits, head_dim = part_acc.shape
    for item in prange(batch * num_heads):
        seq, h = item // num_heads, item % num_heads
        top = part_m[seq, h, 0]
        for s in range(1, num_splits):
            top = max(top, part_m[seq, h, s])
        total = np.float32(0.0)
        for d in range(head_dim):
            out[seq, h, d] = 0.0
        for s in range(num_splits):
            if part_l[seq, h, s] > 0:
                w = np.exp(part_m[seq, h, s] - top)
                total += part_l[seq, h, s] * w
                for d in range(head_dim):
                    out[seq, h, d] += part_acc[seq, h, s, d] * w
        for d in range(head_dim):
            out[seq, h, d] /= total


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor, no copy: 16-bit floats as uint16 bits."""
    tensor = tensor.detach()
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def numba_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_splits: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the kernel on checked CPU tensors (see :func:`kvlib.kernels.dispatch.decode_attention`).

    q: (batch, num_heads, head_dim), cast to float32; k_cache, v_cache: contiguous (num_blocks,
    block_size, num_kv_heads, head_dim); block_tables: (batch, max_blocks); seq_lens: (batch,).
    out: optional float32 (batch, num_heads, head_dim) to write into. Returns float32.
    """
    q32 = q.detach().to(torch.float32).contiguous()
    out = torch.empty_like(q32) if out is None else out
    tables, lengths = block_tables.to(torch.int64).contiguous(), seq_lens.to(torch.int64).contiguous()
    fmt = FORMATS[k_cache.dtype]
    launch(
        q32.numpy(),
        as_numpy(k_cache),
        as_numpy(v_cache),
        tables.numpy(),
        lengths.numpy(),
        fmt,
        num_splits,
        out.numpy(),
    )
    return out


def launch(q, k, v, tables, seq_lens, fmt: int, num_splits: int, out) -> None:
    """:func:`decode_kernel` (and :func:`merge_splits` after it) on numpy views of the tensors
    :func:`numba_decode` takes: the conversions cost tens of microseconds, as much as a short
    decode itself, so a caller that attends over the same tensors at every step (the contiguous
    cache of chapter 1's lean step) makes its views once and calls this."""
    if num_splits > 1:  # each split's (max, sum, acc), merged below
        shape = (*q.shape[:2], num_splits)
        part_m, part_l = np.empty(shape, dtype=np.float32), np.empty(shape, dtype=np.float32)
        part_acc = np.empty((*shape, q.shape[2]), dtype=np.float32)
    else:  # unused by the kernel: placeholders of the right type, made once
        part_m, part_l, part_acc = NO_PARTIALS
    args = (q, k, v, tables, seq_lens, fmt, num_splits, out, part_m, part_l, part_acc)
    use_numba_threads()
    # float16 and bfloat16 share the uint16 code
    timed_first_call("float32" if fmt == FLOAT32 else "16-bit", decode_kernel, args)
    if num_splits > 1:
        timed_first_call("merge", merge_splits, (part_m, part_l, part_acc, out))
