"""Eight float32 lanes as one numba value: explicit SIMD for the decode kernel (chapter 2's roofline).

numba vectorises a loop only when LLVM's auto-vectoriser sees how, and for decode attention's
score loop it picks the wrong dimension: it vectorises the dot product over ``head_dim`` and
ends every score with a horizontal sum of a vector register, which caps the loop far below
the arithmetic units' rate. :mod:`kvlib.kernels.numba_lanes` therefore writes its vectors
out. :data:`float32x8` is a numba type whose value is LLVM's ``<8 x float>``: a local
variable of it lives in a vector register (an AVX ``ymm`` register on x86-64; LLVM splits it
into two 128-bit registers on ARM's NEON). The functions here are its instructions; each is a
few lines of LLVM IR (``@intrinsic``), and each is named for the instruction it becomes:

- :func:`vsplat` (one number in every lane), :func:`vload`, :func:`vstore` (eight
  consecutive float32 of an array, from a flat element index);
- :func:`vadd`, :func:`vsub`, :func:`vmul`, :func:`vmax`, :func:`vfma` (``a * b + c``, fused
  where the processor can), :func:`vfloor`, :func:`vpow2` (2**n by building the exponent
  bits), :func:`vwhere_ge` (a lane-wise choice) and :func:`vany_gt` (does any lane of ``a``
  exceed ``b``'s?);
- :func:`vexp_nonpositive`, the softmax's exponential of :mod:`kvlib.kernels.numba_ops`
  (Cephes' ``expf``) on eight lanes at once, composed from the instructions above.

The values never leave compiled code: no Python object holds one.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model

from kvlib.kernels.numba_ops import EXP_MIN, EXP_POLY, EXP_POLY2, LN2_HIGH, LN2_LOW, LOG2E

LANES = 8  # float32 per vector: one AVX register; the width the kernel's heads-in-lanes loops use
VECTOR = ir.VectorType(ir.FloatType(), LANES)
INT_VECTOR = ir.VectorType(ir.IntType(32), LANES)


class Float32x8(types.Type):
    """numba's type of an ``<8 x float>`` value (eight float32 lanes in one register)."""

    def __init__(self):
        super().__init__(name="float32x8")


float32x8 = Float32x8()


@register_model(Float32x8)
class Float32x8Model(models.PrimitiveModel):
    """A float32x8 is stored as LLVM's ``<8 x float>``, so it stays in a vector register."""

    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, VECTOR)


def _splat(builder: ir.IRBuilder, scalar: ir.Value) -> ir.Value:
    """``scalar`` (an LLVM float) in every lane: insert it in lane 0, then shuffle lane 0 everywhere."""
    lane0 = builder.insert_element(ir.Constant(VECTOR, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(
        lane0, ir.Constant(VECTOR, ir.Undefined), ir.Constant(INT_VECTOR, [0] * LANES)
    )


def _vector_pointer(context, builder, array_type, array, index) -> ir.Value:
    """Address of ``array.flat[index]`` (a C-contiguous float32 array) as a ``<8 x float>*``."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), VECTOR.as_pointer())


def _is_float32_array(array) -> bool:
    return isinstance(array, types.Array) and array.dtype == types.float32 and array.layout == "C"


@intrinsic
def vsplat(typingctx, x):
    """A float32x8 with ``x`` (any number, rounded to float32) in every lane."""
    if not isinstance(x, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        return _splat(builder, context.cast(builder, args[0], signature.args[0], types.float32))

    return float32x8(x), codegen


@intrinsic
def vload(typingctx, array, index):
    """``array.flat[index : index + 8]`` of a C-contiguous float32 array, as a float32x8 (no bounds check)."""
    if not (_is_float32_array(array) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        return builder.load(_vector_pointer(context, builder, signature.args[0], *args), align=4)

    return float32x8(array, index), codegen


@intrinsic
def vstore(typingctx, array, index, vector):
    """Write ``vector`` to ``array.flat[index : index + 8]`` (C-contiguous float32, no bounds check)."""
    if not (_is_float32_array(array) and isinstance(index, types.Integer) and vector == float32x8):
        return None

    def codegen(context, builder, signature, args):
        pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], pointer, align=4)
        return context.get_dummy_value()

    return types.void(array, index, vector), codegen


def _lanewise(num_args: int, emit):
    """An intrinsic taking ``num_args`` float32x8 values and returning ``emit(builder, *values)``
    (numba's intrinsics take no ``*args``, hence one typing function per arity)."""

    def typed(args):
        if any(arg != float32x8 for arg in args):
            return None  # numba then reports the call as untyped

        def codegen(context, builder, signature, values):
            return emit(builder, *values)

        return float32x8(*args), codegen

    def typer1(typingctx, a):
        return typed((a,))

    def typer2(typingctx, a, b):
        return typed((a, b))

    def typer3(typingctx, a, b, c):
        return typed((a, b, c))

    def typer4(typingctx, a, b, c, d):
        return typed((a, b, c, d))

    return intrinsic((typer1, typer2, typer3, typer4)[num_args - 1])


def _call_llvm(builder: ir.IRBuilder, name: str, *values: ir.Value) -> ir.Value:
    """Call the LLVM intrinsic ``name`` (e.g. ``llvm.floor.v8f32``) on vector arguments."""
    function_type = ir.FunctionType(VECTOR, [VECTOR] * len(values))
    return builder.call(cgutils.get_or_insert_function(builder.module, function_type, name), values)


def _pow2(builder: ir.IRBuilder, n: ir.Value) -> ir.Value:
    """2**n for whole numbers n in [-126, 127]: n + 127 written into a float32's exponent bits."""
    exponent = builder.add(builder.fptosi(n, INT_VECTOR), ir.Constant(INT_VECTOR, [127] * LANES))
    return builder.bitcast(builder.shl(exponent, ir.Constant(INT_VECTOR, [23] * LANES)), VECTOR)


# Each is one instruction on a CPU with AVX2 and FMA (vaddps, vsubps, vmulps, vmaxps, vfmadd,
# vroundps); vfma becomes a multiply and an add where there is no fused multiply-add.
vadd = _lanewise(2, lambda b, x, y: b.fadd(x, y))
vsub = _lanewise(2, lambda b, x, y: b.fsub(x, y))
vmul = _lanewise(2, lambda b, x, y: b.fmul(x, y))
vmax = _lanewise(2, lambda b, x, y: b.select(b.fcmp_ordered(">", x, y), x, y))  # y where either is NaN
vfma = _lanewise(3, lambda b, x, y, z: _call_llvm(b, "llvm.fmuladd.v8f32", x, y, z))  # x * y + z
vfloor = _lanewise(1, lambda b, x: _call_llvm(b, "llvm.floor.v8f32", x))
vpow2 = _lanewise(1, _pow2)
vwhere_ge = _lanewise(4, lambda b, x, limit, yes, no: b.select(b.fcmp_ordered(">=", x, limit), yes, no))


@intrinsic
def vany_gt(typingctx, a, b):
    """True when some lane of ``a`` exceeds the same lane of ``b`` (a mask of 8 bits, tested at once)."""
    if not (a == float32x8 and b == float32x8):
        return None

    def codegen(context, builder, signature, args):
        bits = builder.bitcast(builder.fcmp_ordered(">", args[0], args[1]), ir.IntType(LANES))
        return builder.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(LANES), 0))

    return types.boolean(a, b), codegen


@njit(inline="always")
def vexp_nonpositive(x):
    """e**x in each lane, for lanes x <= 0 (scores minus their running max): the arithmetic of
    :func:`kvlib.kernels.numba_ops.exp_nonpositive` on eight lanes, about one ulp; below
    ``EXP_MIN`` (and at -inf) the lane is 0."""
    low = vsplat(EXP_MIN)
    n = vfloor(vfma(vmax(x, low), vsplat(LOG2E), vsplat(0.5)))  # round(x / ln 2)
    r = vsub(vsub(x, vmul(n, vsplat(LN2_HIGH))), vmul(n, vsplat(LN2_LOW)))  # x - n ln 2, exactly
    c0, c1, c2 = EXP_POLY
    c3, c4, c5 = EXP_POLY2
    poly = vfma(
        vfma(vfma(vfma(vfma(vsplat(c0), r, vsplat(c1)), r, vsplat(c2)), r, vsplat(c3)), r, vsplat(c4)),
        r,
        vsplat(c5),
    )
    poly = vadd(vfma(vmul(poly, r), r, r), vsplat(1.0))  # poly r^2 + r + 1
    return vwhere_ge(x, low, vmul(poly, vpow2(n)), vsplat(0.0))
