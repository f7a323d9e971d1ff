"""Decode attention with query heads in the vector lanes: the numba kernel for groups of 8 or more
query heads per KV head (GQA-4 and MQA of chapter 2's roofline; chapter 3's paged kernel).

Scores are ``q . K[t]`` for each query head and each key. Vectorised over ``head_dim``, as
:mod:`kvlib.kernels.numba_decode` does for small groups, every score ends in a horizontal sum
of a vector register, and that caps the loop well below the arithmetic units' rate: fine
where memory bounds the step (MHA, small groups), not where the group carries the arithmetic
towards the ridge point. Here the eight lanes of a :data:`~kvlib.kernels.numba_simd.float32x8`
hold eight query heads of one KV head (a *chunk*), so nothing needs summing across lanes:

- **scores** (:func:`chunk_scores`): for each element ``d`` of ``head_dim``, one vector of
  the chunk's queries (``q_lanes[c, d]``, the queries stored transposed, scale folded in)
  multiplies eight keys' ``K[t, d]``, each broadcast to every lane: nine loads for eight
  fused multiply-adds into eight independent sums, in registers;
- **online softmax** (:func:`chunk_softmax`): running max, rescaling and ``exp`` lane-wise:
  one head per lane, so the whole update is vector arithmetic;
- **values** (:func:`chunk_values`): ``acc_lanes[c, d] += sum_t p[t] * V[t, d]``, eight
  weights held in registers across the pass over ``head_dim``.

A work item walks its blocks in table order; within a block, eight tokens at a time, every
chunk of every KV head, so the block's memory is covered in order, a few rows at a time.
While it reads rows ``t .. t + 7`` it prefetches the rows :data:`PREFETCH_TOKENS` tokens
ahead (:func:`prefetch_ahead`), in this block or in the next one the table names, one cache
line per row every few multiply-adds: no hardware prefetcher can guess where the next block
lies. Leftover tokens of a block (its length not a multiple of eight) take one token at a
time. Every sum is written out, in a fixed order, so these loops need no ``fastmath``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvlib.kernels.numba_ops import CACHE_LINE_BYTES, block_rows, prefetch
from kvlib.kernels.numba_setup import cached_njit
from kvlib.kernels.numba_simd import (
    LANES,
    vadd,
    vany_gt,
    vexp_nonpositive,
    vfma,
    vload,
    vmax,
    vmul,
    vsplat,
    vstore,
    vsub,
)

PREFETCH_TOKENS = 16  # rows are prefetched this many tokens ahead of the rows being read


@njit(inline="always")
def prefetch_ahead(cache, block, upcoming, t, h, d):
    """Prefetch the line at element ``d`` of KV head ``h``'s rows ``PREFETCH_TOKENS`` (at most a
    block) after rows ``t .. t + 7``: in ``block`` while they lie in it, else in ``upcoming``
    (the next block the table names; < 0: none). ``block < 0``: nothing (another chunk of the
    same KV head reads these rows and prefetches them)."""
    if block < 0:
        return
    block_size, num_kv_heads, head_dim = cache.shape[1], cache.shape[2], cache.shape[3]
    ahead = min(PREFETCH_TOKENS, block_size)
    for i in range(LANES):
        row = t + ahead + i
        if row < block_size:
            prefetch(cache, ((block * block_size + row) * num_kv_heads + h) * head_dim + d)
        elif upcoming >= 0:
            prefetch(cache, ((upcoming * block_size + row - block_size) * num_kv_heads + h) * head_dim + d)


@njit(inline="always")
def chunk_scores(q_lanes, c, keys, at, t, h, scores, cache, block, upcoming):
    """scores[t + i, c] = q_lanes[c] . K[t + i, h] for i < 8: the chunk's eight heads in the lanes.

    q_lanes: (num_chunks, head_dim, 8); keys: (blocks, block_size, num_kv_heads, head_dim),
    rows of block ``at``; scores: (block_size, num_chunks, 8). ``cache``, ``block``,
    ``upcoming``: what :func:`prefetch_ahead` reads ahead in (the stored cache, 16-bit or not).
    """
    head_dim = q_lanes.shape[1]
    line = CACHE_LINE_BYTES // cache.itemsize  # elements of a row per cache line
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = vsplat(0.0)
    for start in range(0, head_dim, line):  # one cache line of each row at a time
        prefetch_ahead(cache, block, upcoming, t, h, start)
        for d in range(start, min(start + line, head_dim)):
            x = vload(q_lanes, (c * head_dim + d) * LANES)
            s0 = vfma(x, vsplat(keys[at, t, h, d]), s0)
            s1 = vfma(x, vsplat(keys[at, t + 1, h, d]), s1)
            s2 = vfma(x, vsplat(keys[at, t + 2, h, d]), s2)
            s3 = vfma(x, vsplat(keys[at, t + 3, h, d]), s3)
            s4 = vfma(x, vsplat(keys[at, t + 4, h, d]), s4)
            s5 = vfma(x, vsplat(keys[at, t + 5, h, d]), s5)
            s6 = vfma(x, vsplat(keys[at, t + 6, h, d]), s6)
            s7 = vfma(x, vsplat(keys[at, t + 7, h, d]), s7)
    row, step = (t * scores.shape[1] + c) * LANES, scores.shape[1] * LANES  # scores[t, c], one token on
    vstore(scores, row, s0)
    vstore(scores, row + step, s1)
    vstore(scores, row + 2 * step, s2)
    vstore(scores, row + 3 * step, s3)
    vstore(scores, row + 4 * step, s4)
    vstore(scores, row + 5 * step, s5)
    vstore(scores, row + 6 * step, s6)
    vstore(scores, row + 7 * step, s7)


@njit(inline="always")
def chunk_values(values, at, t, h, weights, c, acc_lanes, cache, block, upcoming):
    """acc_lanes[c, d] += sum over i < 8 of weights[t + i, c] * V[t + i, h, d], for every d.

    weights: (block_size, num_chunks, 8), the block's exp(score - max); acc_lanes:
    (num_chunks, head_dim, 8). The eight weight vectors stay in registers; two chains of four
    multiply-adds per element keep the sum's dependency short.
    """
    head_dim = acc_lanes.shape[1]
    line = CACHE_LINE_BYTES // cache.itemsize
    row, step = (t * weights.shape[1] + c) * LANES, weights.shape[1] * LANES
    p0, p1 = vload(weights, row), vload(weights, row + step)
    p2, p3 = vload(weights, row + 2 * step), vload(weights, row + 3 * step)
    p4, p5 = vload(weights, row + 4 * step), vload(weights, row + 5 * step)
    p6, p7 = vload(weights, row + 6 * step), vload(weights, row + 7 * step)
    for start in range(0, head_dim, line):  # one cache line of each row at a time
        prefetch_ahead(cache, block, upcoming, t, h, start)
        for d in range(start, min(start + line, head_dim)):
            out = (c * head_dim + d) * LANES
            even = vfma(p0, vsplat(values[at, t, h, d]), vload(acc_lanes, out))
            odd = vmul(p1, vsplat(values[at, t + 1, h, d]))
            even = vfma(p2, vsplat(values[at, t + 2, h, d]), even)
            odd = vfma(p3, vsplat(values[at, t + 3, h, d]), odd)
            even = vfma(p4, vsplat(values[at, t + 4, h, d]), even)
            odd = vfma(p5, vsplat(values[at, t + 5, h, d]), odd)
            even = vfma(p6, vsplat(values[at, t + 6, h, d]), even)
            odd = vfma(p7, vsplat(values[at, t + 7, h, d]), odd)
            vstore(acc_lanes, out, vadd(even, odd))


@njit(inline="always")
def token_scores(q_lanes, c, keys, at, t, h, scores):
    """scores[t, c] = q_lanes[c] . K[t, h]: one token (a block's leftover, fewer than eight)."""
    head_dim = q_lanes.shape[1]
    total = vsplat(0.0)
    for d in range(head_dim):
        total = vfma(vload(q_lanes, (c * head_dim + d) * LANES), vsplat(keys[at, t, h, d]), total)
    vstore(scores, (t * scores.shape[1] + c) * LANES, total)


@njit(inline="always")
def token_values(values, at, t, h, weights, c, acc_lanes):
    """acc_lanes[c, d] += weights[t, c] * V[t, h, d], for every d: one leftover token."""
    head_dim = acc_lanes.shape[1]
    p = vload(weights, (t * weights.shape[1] + c) * LANES)
    for d in range(head_dim):
        out = (c * head_dim + d) * LANES
        vstore(acc_lanes, out, vfma(p, vsplat(values[at, t, h, d]), vload(acc_lanes, out)))


@njit(inline="always")
def chunk_softmax(scores, num, c, m_lanes, l_lanes, acc_lanes):
    """Online softmax of chunk ``c`` after a block of ``num`` tokens, one query head per lane.

    Raise each head's running max (m_lanes) to the block's largest score, rescale its sum
    (l_lanes) and acc_lanes by exp(old max - new max) when some lane's max grew, then turn
    the block's scores into exp(score - max) in place and add them to the sums.
    """
    head_dim, width = acc_lanes.shape[1], scores.shape[1] * LANES
    old = vload(m_lanes, c * LANES)
    new = old
    for t in range(num):
        new = vmax(new, vload(scores, t * width + c * LANES))
    total = vload(l_lanes, c * LANES)
    if vany_gt(new, old):  # otherwise every factor is exp(0) = 1
        alpha = vexp_nonpositive(vsub(old, new))
        total = vmul(total, alpha)
        for d in range(head_dim):
            out = (c * head_dim + d) * LANES
            vstore(acc_lanes, out, vmul(vload(acc_lanes, out), alpha))
        vstore(m_lanes, c * LANES, new)
    for t in range(num):
        at = t * width + c * LANES
        weight = vexp_nonpositive(vsub(vload(scores, at), new))
        vstore(scores, at, weight)
        total = vadd(total, weight)
    vstore(l_lanes, c * LANES, total)


@njit(inline="always")
def block_lanes(q_lanes, k, v, block, num, fmt, upcoming, scores, m_lanes, l_lanes, acc_lanes, scratch):
    """One block of ``num`` tokens for every chunk: scores, online softmax, weighted values."""
    num_chunks = q_lanes.shape[0]
    chunks_per_head = num_chunks // k.shape[2]
    whole = num - num % LANES  # tokens taken eight at a time
    keys, at = block_rows(k, block, num, fmt, scratch)
    for t in range(0, whole, LANES):
        for c in range(num_chunks):
            ahead = block if c % chunks_per_head == 0 else -1  # the head's first chunk prefetches
            chunk_scores(q_lanes, c, keys, at, t, c // chunks_per_head, scores, k, ahead, upcoming)
    for t in range(whole, num):
        for c in range(num_chunks):
            token_scores(q_lanes, c, keys, at, t, c // chunks_per_head, scores)
    for c in range(num_chunks):
        chunk_softmax(scores, num, c, m_lanes, l_lanes, acc_lanes)
    values, at = block_rows(v, block, num, fmt, scratch)  # K's rows are no longer needed
    for t in range(0, whole, LANES):
        for c in range(num_chunks):
            ahead = block if c % chunks_per_head == 0 else -1
            chunk_values(values, at, t, c // chunks_per_head, scores, c, acc_lanes, v, ahead, upcoming)
    for t in range(whole, num):
        for c in range(num_chunks):
            token_values(values, at, t, c // chunks_per_head, scores, c, acc_lanes)


@cached_njit()
def attend_lanes(q, k, v, table, first_block, end_block, seq_len, fmt, m, denom, acc, scratch):
    """:func:`kvlib.kernels.numba_decode.attend_blocks`'s contract, query heads in the lanes.

    q: (num_heads, head_dim) float32, num_heads / num_kv_heads a multiple of 8 (``LANES``);
    k, v: (num_blocks, block_size, num_kv_heads, head_dim) float32 or uint16 (``fmt``); table:
    the sequence's block table. Sets m, denom (num_heads,) and acc (num_heads, head_dim): the
    running max, the sum of exp(score - max) and the unnormalised weighted sum of V over
    blocks ``[first_block, end_block)``. scratch: (1, block_size, num_kv_heads, head_dim) for
    16-bit storage (see :func:`~kvlib.kernels.numba_ops.block_rows`).
    """
    num_heads, head_dim = q.shape
    block_size = k.shape[1]
    num_chunks = num_heads // LANES
    scale = np.float32(1.0 / np.sqrt(np.float64(head_dim)))
    q_lanes = np.empty((num_chunks, head_dim, LANES), dtype=np.float32)  # heads c*8 .. c*8+7, transposed
    for qh in range(num_heads):
        for d in range(head_dim):
            q_lanes[qh // LANES, d, qh % LANES] = q[qh, d] * scale
    m_lanes = np.full(num_heads, -np.inf, dtype=np.float32)
    l_lanes = np.zeros(num_heads, dtype=np.float32)
    acc_lanes = np.zeros((num_chunks, head_dim, LANES), dtype=np.float32)
    scores = np.empty((block_size, num_chunks, LANES), dtype=np.float32)
    for j in range(first_block, end_block):
        block = table[j]  # one table read per block, not per token
        num = min(block_size, seq_len - j * block_size)  # tokens of this block that exist
        upcoming = table[j + 1] if j + 1 < end_block else -1  # prefetched meanwhile
        block_lanes(q_lanes, k, v, block, num, fmt, upcoming, scores, m_lanes, l_lanes, acc_lanes, scratch)
    for qh in range(num_heads):
        m[qh], denom[qh] = m_lanes[qh], l_lanes[qh]
        for d in range(head_dim):
            acc[qh, d] = acc_lanes[qh // LANES, d, qh % LANES]
