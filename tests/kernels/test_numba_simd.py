"""The eight-lane instructions of kvlib.kernels.numba_simd do what their names say, lane by lane."""

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit  # noqa: E402
from numba.core.errors import TypingError  # noqa: E402

from kvlib.kernels.numba_simd import (  # noqa: E402
    LANES,
    vadd,
    vany_gt,
    vexp_nonpositive,
    vfloor,
    vfma,
    vload,
    vmax,
    vmul,
    vpow2,
    vsplat,
    vstore,
    vsub,
    vwhere_ge,
)


@njit
def _lanewise(a, b, c, out):
    x, y, z = vload(a, 0), vload(b, 0), vload(c, 0)
    vstore(out, 0, vadd(x, y))
    vstore(out, 8, vsub(x, y))
    vstore(out, 16, vmul(x, y))
    vstore(out, 24, vmax(x, y))
    vstore(out, 32, vfma(x, y, z))
    vstore(out, 40, vfloor(x))
    vstore(out, 48, vwhere_ge(x, y, z, vsplat(7)))
    vstore(out, 56, vsplat(2.5))


def test_each_instruction_acts_lane_by_lane():
    rng = np.random.default_rng(0)
    a, b, c = (rng.uniform(-4, 4, LANES).astype(np.float32) for _ in range(3))
    b[3] = a[3]  # an equal lane: vwhere_ge takes "yes" there, vmax either
    out = np.empty(8 * LANES, dtype=np.float32)
    _lanewise(a, b, c, out)
    lanes = out.reshape(8, LANES)
    assert np.array_equal(lanes[0], a + b) and np.array_equal(lanes[1], a - b)
    assert np.array_equal(lanes[2], a * b) and np.array_equal(lanes[3], np.maximum(a, b))
    exact = a.astype(np.float64) * b + c  # fused or not, within one rounding of float32
    assert np.allclose(lanes[4], exact, rtol=1e-6, atol=1e-6)
    assert np.array_equal(lanes[5], np.floor(a))
    assert np.array_equal(lanes[6], np.where(a >= b, c, 7))
    assert np.array_equal(lanes[7], np.full(LANES, 2.5, np.float32))


@njit
def _at_offset(source, start, out):
    vstore(out, start + 1, vload(source, start))


def test_load_and_store_read_and_write_eight_floats_at_any_element():
    source = np.arange(32, dtype=np.float32)
    out = np.zeros(32, dtype=np.float32)
    _at_offset(source, 5, out)  # not aligned to 32 bytes
    assert np.array_equal(out[6:14], source[5:13]) and not out[:6].any() and not out[14:].any()


@njit
def _powers(n, out):
    vstore(out, 0, vpow2(vload(n, 0)))


def test_pow2_builds_exact_powers_of_two():
    n = np.array([-126, -100, -1, 0, 1, 10, 100, 127], dtype=np.float32)
    out = np.empty(LANES, dtype=np.float32)
    _powers(n, out)
    assert np.array_equal(out, np.ldexp(np.float32(1), n.astype(int)).astype(np.float32))


@njit
def _any(a, b):
    return vany_gt(vload(a, 0), vload(b, 0))


@pytest.mark.parametrize("lane", range(LANES))
def test_any_gt_sees_every_lane(lane):
    a, b = np.zeros(LANES, np.float32), np.zeros(LANES, np.float32)
    assert not _any(a, b)
    a[lane] = 1e-30
    assert _any(a, b) and not _any(b, a)


@njit
def _exp_all(x, out):
    for i in range(0, x.shape[0], LANES):
        vstore(out, i, vexp_nonpositive(vload(x, i)))


def test_the_vector_exponential_is_the_scalar_ones_accuracy():
    """About one float32 ulp over the softmax's range; 0 below -87 and at -inf (as exp_nonpositive)."""
    x = np.append(-np.linspace(0, 80, 99_996), [-87.5, -200.0, -np.inf, -np.inf]).astype(
        np.float32
    )  # 8 x 12,500
    out = np.empty_like(x)
    _exp_all(x, out)
    exact = np.exp(x[:-4].astype(np.float64))
    assert (np.abs(out[:-4] - exact) / exact).max() < 2e-7
    assert not out[-4:].any()


def test_instructions_refuse_operands_they_cannot_take():
    @njit
    def load_doubles(a):
        return vload(a, 0)

    with pytest.raises(TypingError):
        load_doubles(np.zeros(8))  # float64: not eight float32 lanes

    @njit
    def add_a_number(a):
        return vadd(vload(a, 0), 1.0)

    with pytest.raises(TypingError):
        add_a_number(np.zeros(8, np.float32))
