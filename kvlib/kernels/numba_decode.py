"""The fused paged decode kernel on the CPU, in numba (chapter 2's roofline, chapter 3's paging cost).

One new query token per sequence attends over the sequence's keys and values, read *in place*
from the blocks its block table names: no gather copy (what :mod:`kvlib.kernels.torch_gather`
makes). The work is parallel over (sequence, KV head, split) and, for each, loops over the
blocks (block-outer): each K row and each V row of a block is read once, for all the query
heads of its group (GQA/MQA read a K/V head once per group, not once per query head), and an
online softmax keeps a running maximum and sum per query head, so that each block's
probabilities are used at once and never stored for the whole context.

Split-K (Flash-Decoding): when batch * num_kv_heads is below the thread count, each
sequence's blocks are split into ``num_splits`` ranges, each writing a partial (max, sum,
weighted sum of V) that a second, small pass merges by log-sum-exp.

Arithmetic is float32 and follows the written order (``fastmath`` off: no reassociation
the source does not spell out). A dot product adds eight interleaved partial sums, then
pairs them in a fixed tree: the processor's SIMD lanes get independent additions, and the
result does not depend on the compiler. numba has no float16 on the CPU, so float16 and
bfloat16 storage arrive as ``uint16`` arrays and are converted row by row with bit
operations and an LLVM bitcast (:func:`bits_to_float32`). Compiled code is cached on disk
(``cache=True``); :func:`jit_seconds` reports what the first call of each storage type cost
in this process (compilation, or loading the cache).
"""

from __future__ import annotations

import time

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2  # storage format codes passed to the kernel
FORMATS = {torch.float32: FLOAT32, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16}
HALF_TO_FLOAT_SCALE = np.float32(2.0**112)  # float16 exponent bias 15 -> float32 bias 127
# LLVM may reassociate float32 sums (vectorise a dot product over head_dim, a sum over a
# block's tokens) and fuse multiply-adds; never assume no inf/NaN (the running max starts at -inf)
SUMS_IN_ANY_ORDER = {"reassoc", "contract"}
# "float32", "16-bit" (float16 and bfloat16 share the uint16 code) or "merge" -> seconds of the
# first call in this process
_JIT_SECONDS: dict[str, float] = {}


@intrinsic
def bits_to_float32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32 (LLVM ``trunc`` and ``bitcast``: no
    conversion). numba widens ``uint32 << uint32`` to 64 bits, hence the truncation."""
    if not isinstance(bits, types.Integer) or bits.bitwidth < 32:
        return None
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        low = builder.trunc(args[0], ir.IntType(32)) if bits.bitwidth > 32 else args[0]
        return builder.bitcast(low, ir.FloatType())

    return sig, codegen


@njit(inline="always")
def half_to_float(h):
    """The float32 value of float16 bits ``h`` (a uint16), exact for every input.

    Sign, exponent and mantissa move to their float32 places; the float32 whose exponent is
    the half's raw exponent, times 2**112, is the half's value, subnormals included (the
    product of a float32 subnormal and a power of two is exact). All-ones exponents (inf,
    NaN) get float32's all-ones exponent first, which the product keeps.
    """
    x = np.uint32(h)
    bits = ((x & np.uint32(0x8000)) << np.uint32(16)) | ((x & np.uint32(0x7FFF)) << np.uint32(13))
    inf_or_nan = np.uint32((x & np.uint32(0x7C00)) == np.uint32(0x7C00))  # 1 or 0, no branch
    bits |= inf_or_nan * np.uint32(0x7F800000)
    return bits_to_float32(bits) * HALF_TO_FLOAT_SCALE


def stage_row(cache, block, token, head, fmt, row):
    """Make row ``cache[block, token, head]`` readable as float32 (Python stand-in; numba compiles
    the overload): float32 storage is read in place, 16-bit storage is converted into ``row``.
    Rows are indexed element by element, never sliced: a slice in numba is a new array whose
    reference count every thread would update, in the innermost loop."""
    raise NotImplementedError("stage_row runs only inside numba-compiled code")


@overload(stage_row, inline="always")
def _stage_row(cache, block, token, head, fmt, row):
    """float32 storage: nothing to do; uint16 storage: float16 or bfloat16 bits converted."""
    if cache.dtype == types.float32:
        return lambda cache, block, token, head, fmt, row: None

    def convert(cache, block, token, head, fmt, row):
        if fmt == BFLOAT16:  # bfloat16 is the top half of a float32
            for d in range(row.shape[0]):
                row[d] = bits_to_float32(np.uint32(cache[block, token, head, d]) << np.uint32(16))
        else:
            for d in range(row.shape[0]):
                row[d] = half_to_float(cache[block, token, head, d])

    return convert


def row_dot(q, g, cache, block, token, head, row):
    """Sum over d of q[g, d] times the staged row (see :func:`stage_row`); compiled by the overload."""
    raise NotImplementedError("row_dot runs only inside numba-compiled code")


@overload(row_dot, inline="always")
def _row_dot(q, g, cache, block, token, head, row):
    """float32 storage: the dot with the row in place; uint16: with its converted copy."""
    if cache.dtype == types.float32:

        def in_place(q, g, cache, block, token, head, row):
            total = np.float32(0.0)
            for d in range(q.shape[1]):
                total += q[g, d] * cache[block, token, head, d]
            return total

        return in_place

    def staged(q, g, cache, block, token, head, row):
        total = np.float32(0.0)
        for d in range(q.shape[1]):
            total += q[g, d] * row[d]
        return total

    return staged


def row_axpy(acc, g, p, cache, block, token, head, row):
    """acc[g, :] += p times the staged row (see :func:`stage_row`); compiled by the overload."""
    raise NotImplementedError("row_axpy runs only inside numba-compiled code")


@overload(row_axpy, inline="always")
def _row_axpy(acc, g, p, cache, block, token, head, row):
    """float32 storage: the row read in place; uint16: its converted copy."""
    if cache.dtype == types.float32:

        def in_place(acc, g, p, cache, block, token, head, row):
            for d in range(acc.shape[1]):
                acc[g, d] += p * cache[block, token, head, d]

        return in_place

    def staged(acc, g, p, cache, block, token, head, row):
        for d in range(acc.shape[1]):
            acc[g, d] += p * row[d]

    return staged


# Cephes' expf: e**x = 2**n * e**r with n = round(x / ln 2) and |r| <= ln(2) / 2, ln 2 split in
# two constants so that x - n ln 2 is exact, and a degree-5 polynomial for e**r (error ~1 ulp)
LN2_HIGH, LN2_LOW = np.float32(0.693359375), np.float32(-2.12194440e-4)
LOG2E = np.float32(1.44269504088896341)
EXP_POLY = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3))
EXP_POLY2 = tuple(np.float32(c) for c in (4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
EXP_MIN = np.float32(-87.0)  # below: e**x < 2**-125, returned as 0 (so is exp(-inf))


@njit(inline="always")
def exp_nonpositive(x):
    """e**x for float32 x <= 0 (softmax weights: scores minus their running max) in arithmetic that
    vectorises: a libm call per score would cost more than the score's dot product."""
    n = np.floor(max(x, EXP_MIN) * LOG2E + np.float32(0.5))
    r = (x - n * LN2_HIGH) - n * LN2_LOW
    c0, c1, c2 = EXP_POLY
    c3, c4, c5 = EXP_POLY2
    poly = (((((c0 * r + c1) * r + c2) * r + c3) * r + c4) * r + c5) * r * r + r + np.float32(1.0)
    scale = bits_to_float32((np.int64(n) + np.int64(127)) << np.int64(23))  # 2**n, n in [-126, 0]
    return poly * scale if x >= EXP_MIN else np.float32(0.0)


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


@njit(cache=True, fastmath=SUMS_IN_ANY_ORDER)
def attend_range(q, k, v, table, first_block, end_block, seq_len, head, fmt, m, denom, acc):
    """Online softmax of one group's queries over blocks ``[first_block, end_block)`` of one sequence.

    q: (group, head_dim) float32; k, v: (num_blocks, block_size, num_kv_heads, head_dim)
    table: (max_blocks,) the sequence's block table; head: the KV head
    m, denom: (group,) running max and sum of exp(score - max) (the softmax's denominator);
    acc: (group, head_dim), the sum of exp(score - max) * V rows, not yet divided by ``denom``.
    All three are set here.
    """
    group, head_dim = q.shape
    block_size = k.shape[1]
    scale = np.float32(1.0 / np.sqrt(np.float64(head_dim)))
    scores = np.empty((group, block_size), dtype=np.float32)  # one block's scores
    row = np.empty(head_dim, dtype=np.float32)  # the K or V row being used, as float32
    m[:] = -np.inf
    denom[:] = 0.0
    acc[:] = 0.0
    for j in range(first_block, end_block):
        block = table[j]  # one table read per block, not per token
        num = min(block_size, seq_len - j * block_size)  # tokens of this block that exist
        for t in range(num):  # each K row read once, for every query head of the group
            stage_row(k, block, t, head, fmt, row)
            for g in range(group):
                scores[g, t] = row_dot(q, g, k, block, t, head, row) * scale
        for g in range(group):
            rescale(scores, num, g, m, denom, acc)
        for t in range(num):  # each V row read once, for every query head of the group
            stage_row(v, block, t, head, fmt, row)
            for g in range(group):
                row_axpy(acc, g, scores[g, t], v, block, t, head, row)


@njit(parallel=True, cache=True, fastmath=False)
def decode_kernel(q, k, v, tables, seq_lens, fmt, num_splits, out, part_m, part_l, part_acc):
    """Decode attention of a batch, parallel over (sequence, KV head, split).

    q, out: (batch, num_heads, head_dim) float32; k, v: (num_blocks, block_size, num_kv_heads,
    head_dim) float32 or uint16 (``fmt``); tables: (batch, max_blocks) int64; seq_lens:
    (batch,) int64. With one split the result goes to ``out``; with more, each split's
    (max, sum, acc) goes to part_m, part_l (batch, num_heads, num_splits) and part_acc
    (batch, num_heads, num_splits, head_dim), for :func:`merge_splits`.
    """
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    for item in prange(batch * num_kv_heads * num_splits):
        seq = item // (num_kv_heads * num_splits)
        head = item // num_splits % num_kv_heads
        split = item % num_splits
        num_blocks = (seq_lens[seq] + block_size - 1) // block_size
        first = split * num_blocks // num_splits  # balanced ranges; empty when blocks < splits
        end = (split + 1) * num_blocks // num_splits
        heads = slice(head * group, (head + 1) * group)  # the query heads of this KV head
        q_group = q[seq, heads].copy()  # (group, head_dim)
        m = np.empty(group, dtype=np.float32)
        denom = np.empty(group, dtype=np.float32)
        acc = np.empty((group, head_dim), dtype=np.float32)
        attend_range(q_group, k, v, tables[seq], first, end, seq_lens[seq], head, fmt, m, denom, acc)
        if num_splits == 1:
            for g in range(group):
                for d in range(head_dim):
                    out[seq, head * group + g, d] = acc[g, d] / denom[g]
        else:
            part_m[seq, heads, split] = m
            part_l[seq, heads, split] = denom
            part_acc[seq, heads, split] = acc


@njit(parallel=True, cache=True, fastmath=False)
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
    batch, num_heads, head_dim = q32.shape
    out = torch.empty_like(q32) if out is None else out
    shape = (batch, num_heads, num_splits) if num_splits > 1 else (1, 1, 1)
    part_m = np.empty(shape, dtype=np.float32)
    part_l = np.empty(shape, dtype=np.float32)
    part_acc = np.empty((*shape, head_dim if num_splits > 1 else 1), dtype=np.float32)
    args = (
        q32.numpy(),
        as_numpy(k_cache),
        as_numpy(v_cache),
        block_tables.to(torch.int64).contiguous().numpy(),
        seq_lens.to(torch.int64).contiguous().numpy(),
        FORMATS[k_cache.dtype],
        num_splits,
        out.numpy(),
        part_m,
        part_l,
        part_acc,
    )
    _timed_first_call("float32" if k_cache.dtype == torch.float32 else "16-bit", decode_kernel, args)
    if num_splits > 1:
        _timed_first_call("merge", merge_splits, (part_m, part_l, part_acc, args[7]))
    return out


def _timed_first_call(name: str, kernel, args: tuple) -> None:
    """Call ``kernel(*args)``; the first call of each ``name`` in this process is timed (it compiles,
    or loads numba's on-disk cache)."""
    if name in _JIT_SECONDS:
        kernel(*args)
        return
    start = time.perf_counter()
    kernel(*args)
    _JIT_SECONDS[name] = time.perf_counter() - start


def jit_seconds() -> dict[str, float]:
    """Seconds of the first call in this process of each compiled kernel run so far (compilation, or
    loading numba's cache): keys "float32", "16-bit" and "merge"."""
    return dict(_JIT_SECONDS)


def numba_threads() -> int:
    """Threads numba's parallel loops run on (``numba.set_num_threads`` changes it)."""
    return numba.get_num_threads()
