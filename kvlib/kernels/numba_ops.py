"""Scalar building blocks of the numba decode kernel (:mod:`kvlib.kernels.numba_decode`, chapters 2, 3).

numba compiles them into the kernel's loops (``inline="always"``); each does one thing the
kernel needs and numba does not offer on a CPU:

- :func:`bits_to_float32`, :func:`half_to_float` and :func:`block_rows`: float16 and bfloat16
  storage, which numba cannot hold as floats, arrives as ``uint16`` bits and is converted to
  float32 exactly, one block at a time;
- :func:`exp_nonpositive`: the softmax's exponential in arithmetic that vectorises;
- :func:`prefetch` and :func:`prefetch_rows`: a hint that brings the next block of the block
  table towards the core while the current one is computed;
- :func:`float32_at`: a tensor's memory seen from compiled code, by its address (the lean
  step's products of :mod:`kvlib.kernels.numba_row_product` take addresses, not arrays).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2  # storage format codes passed to the kernel
HALF_TO_FLOAT_SCALE = np.float32(2.0**112)  # float16 exponent bias 15 -> float32 bias 127
CACHE_LINE_BYTES = 64
PREFETCH_BYTES = 16 * 1024  # how far ahead of its reads the kernel prefetches the next block


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


def block_rows(cache, block, num, fmt, scratch):
    """The ``num`` stored tokens of block ``block`` as float32, for :func:`attend_blocks` (Python
    stand-in; numba compiles the overload): returns (array, index) with the rows at
    ``array[index, :num]``. float32 storage is read in place, (cache, block); 16-bit storage is
    converted into ``scratch`` (1, block_size, num_kv_heads, head_dim), (scratch, 0), in the
    block's own order: one pass over its contiguous memory."""
    raise NotImplementedError("block_rows runs only inside numba-compiled code")


@overload(block_rows, inline="always")
def _block_rows(cache, block, num, fmt, scratch):
    """float32 storage: the block itself; uint16 storage: float16 or bfloat16 bits converted."""
    if cache.dtype == types.float32:
        return lambda cache, block, num, fmt, scratch: (cache, block)

    def convert(cache, block, num, fmt, scratch):
        num_kv_heads, head_dim = cache.shape[2], cache.shape[3]
        for t in range(num):
            for h in range(num_kv_heads):
                if fmt == BFLOAT16:  # bfloat16 is the top half of a float32
                    for d in range(head_dim):
                        scratch[0, t, h, d] = bits_to_float32(
                            np.uint32(cache[block, t, h, d]) << np.uint32(16)
                        )
                else:
                    for d in range(head_dim):
                        scratch[0, t, h, d] = half_to_float(cache[block, t, h, d])
        return scratch, 0

    return convert


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


@intrinsic
def prefetch(typingctx, array, offset):
    """Ask the processor to bring the cache line of ``array.flat[offset]`` towards the core
    (``llvm.prefetch``: a read, to be kept in every cache level); no effect on results."""
    if not isinstance(array, types.Array) or not isinstance(offset, types.Integer):
        return None
    sig = types.void(array, offset)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        int32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [address.type, int32, int32, int32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read (0), keep in all levels (3), data cache (1)
        builder.call(fn, [address, ir.Constant(int32, 0), ir.Constant(int32, 3), ir.Constant(int32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def prefetch_rows(cache, block, t, h, num_rows):
    """Prefetch what the kernel will read ``PREFETCH_BYTES`` after rows ``cache[*, t .. t +
    num_rows - 1, h]`` of the current block, when that lies in the next block, ``block``.

    The hardware prefetcher follows a block's contiguous memory, but cannot know which block
    the table names next. So the kernel asks for the next block's rows, ``PREFETCH_BYTES``
    ahead of where it reads, a few cache lines at a time between the arithmetic: the memory
    system always has requests in flight and never receives a burst (a burst would fill the
    miss queue and stall like ordinary loads). A block smaller than the distance is prefetched
    row for row while the current one is read. ``block < 0``: no next block.
    """
    if block < 0:
        return
    block_size, num_kv_heads, head_dim = cache.shape[1], cache.shape[2], cache.shape[3]
    rows_per_block = block_size * num_kv_heads
    ahead = PREFETCH_BYTES // (head_dim * cache.itemsize)  # rows
    step = CACHE_LINE_BYTES // cache.itemsize
    for r in range(num_rows):
        row = (t + r) * num_kv_heads + h  # row within the block, in memory order
        target = row if rows_per_block <= ahead else row + ahead - rows_per_block
        if target >= 0:  # within PREFETCH_BYTES of the block's end
            start = (block * rows_per_block + target) * head_dim
            for offset in range(0, head_dim, step):
                prefetch(cache, start + offset)


@intrinsic
def float32_at(typingctx, address):
    """The float32 pointer at integer ``address`` (a ``tensor.data_ptr()``), for ``numba.carray``.

    A PyTorch tensor cannot cross into numba; its numpy view can, but making one dispatches
    four PyTorch operators, which would cost a decode step more than the product saves. The
    caller keeps the tensor alive, contiguous and float32 while compiled code reads it.
    """
    if not isinstance(address, types.Integer):
        return None
    sig = types.CPointer(types.float32)(address)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.FloatType().as_pointer())

    return sig, codegen
