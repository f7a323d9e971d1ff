"""How the entry points of chapter 4's serving code check their arguments: counts and non-negative numbers.

A serving run takes counts (slots, tokens, sequences, requests) and times (arrivals, step
constants, rates). A float count (``block_size=1.5``), a bool (``True`` requests), a string
rate, a NaN arrival or a negative time used to run on, raise a raw numpy or Python error far
away, or hang; each of these checks turns such a value into a one-line
:class:`~kvlib.KVLibError` that names the argument and the value. Numpy integers and floats
count as integers and real numbers: a reader's ``np.int64(16)`` is a block size.
"""

from __future__ import annotations

import math
import numbers

from kvlib import KVLibError


def require_count(value, name: str, low: int = 1) -> int:
    """``value`` as a plain int, if it is an integer (not a bool) >= ``low``; else a KVLibError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise KVLibError(f"{name} must be an integer >= {low}, not {value!r}"[:200])
    return int(value)


def require_real(value, name: str, allow_inf: bool = False, positive: bool = False) -> float:
    """``value`` as a float, if it is a real number >= 0 (> 0 if ``positive``; finite unless ``allow_inf``);
    else a KVLibError naming ``name``.

    NaN is refused everywhere: it compares false with everything, so a NaN arrival never
    arrives and a NaN step constant makes every time NaN.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or math.isnan(value)
        or value < 0
        or (positive and value == 0)
        or (math.isinf(value) and not allow_inf)
    ):
        bound = "> 0" if positive else ">= 0"
        limit = f"a number {bound} (or inf)" if allow_inf else f"a finite number {bound}"
        raise KVLibError(f"{name} must be {limit}, not {value!r}"[:200])
    return float(value)


def are_token_ids(values) -> bool:
    """Is ``values`` a tuple or list of integers >= 0 (numpy integers too; bools, floats and strings not)?"""
    return isinstance(values, tuple | list) and all(
        (type(t) is int or (isinstance(t, numbers.Integral) and not isinstance(t, bool))) and t >= 0
        for t in values
    )
