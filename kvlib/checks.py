"""How kvlib checks the arguments at its public edges: one copy of each check, used by every package.

vLLM's way: an entry point (a constructor, a function a reader calls, a CLI command) checks its
arguments once and raises a one-line :class:`~kvlib.KVLibError` that names the argument, the
value and what is allowed; the hot loops behind it trust what they are given. A float count
(``block_size=1.5``), a bool (``True`` requests), a NaN time or a negative size would otherwise
run on, raise a raw Python error far away, or give a wrong number. Numpy integers and floats count
as integers and real numbers (a reader's ``np.int64(16)`` is a block size); what the checks return
is a plain ``int`` or ``float``, so that no numpy integer overflows in the arithmetic after them.
"""

from __future__ import annotations

import math
import numbers
import operator
import reprlib
from collections.abc import Sequence

from kvlib import KVLibError

MAX_MESSAGE = 200  # a message quotes the value, cut to keep the error on one readable line
_REPR = reprlib.Repr()  # (Python 3.10 and 3.11 take no keyword arguments here)
_REPR.maxlong, _REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 70, 60, 60, 2


def shown(value) -> str:
    """``value`` as a message quotes it: its repr, short (a list of a million items is cut) and safe
    (an integer of more than 4,300 digits has no repr in Python, so its size is given instead)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 200:
        return f"an integer of about {int(abs(value).bit_length() * math.log10(2)) + 1:,} digits"
    try:
        return _REPR.repr(value)
    except Exception:  # a reader's object whose __repr__ fails is still named by its type
        return f"a {type(value).__name__}"


def is_int(value) -> bool:
    """True for an integer (a numpy integer too), False for a bool (``True`` is never a count) or else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def require_int(value, name: str, low: int | None = 1, high: int | None = None) -> int:
    """``value`` as a plain int if it is an integer (not a bool) >= ``low`` (and <= ``high``), else a
    KVLibError naming ``name``, the value and the range allowed; ``low=None``: any integer.

    kvlib's one integer check: the sizing layer's ``require_count`` is this with kvlib's bound on
    counts as ``high`` (and its own words for it)."""
    if low is None:
        allowed = "" if high is None else f" <= {high:,}"
    else:
        allowed = f" >= {low}" if high is None else f" from {low} to {high:,}"
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        raise KVLibError(f"{name} must be an integer{allowed}, not {shown(value)}"[:MAX_MESSAGE])
    return int(value)


def require_real(value, name: str, allow_inf: bool = False, positive: bool = False) -> float:
    """``value`` as a float, if it is a real number >= 0 (> 0 if ``positive``; finite unless ``allow_inf``);
    else a KVLibError naming ``name``.

    NaN is refused everywhere: it compares false with everything, so a NaN arrival never
    arrives and a NaN step constant makes every time NaN.
    """
    number = as_float(value)
    if (
        number is None
        or math.isnan(number)
        or number < 0
        or (positive and number == 0)
        or (math.isinf(number) and not allow_inf)
    ):
        bound = "> 0" if positive else ">= 0"
        limit = f"a number {bound} (or inf)" if allow_inf else f"a finite number {bound}"
        raise KVLibError(f"{name} must be {limit}, not {shown(value)}"[:MAX_MESSAGE])
    return number


def as_float(value) -> float | None:
    """A real number (not a bool) as a float, or None for anything else and for an integer beyond
    a float's range (10**400 would raise OverflowError in math.isfinite and in float())."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def are_token_ids(values) -> bool:
    """Is ``values`` a tuple or list of integers >= 0 (numpy integers too; bools, floats and strings not)?"""
    return isinstance(values, tuple | list) and all(
        (type(t) is int or (isinstance(t, numbers.Integral) and not isinstance(t, bool))) and t >= 0
        for t in values
    )


def check_new_tokens(num_new, length: int, max_len: int) -> None:
    """A cache's ``prepare(num_new)``: ``num_new`` an int >= 1 that fits beside the ``length`` tokens
    held, within ``max_len``; else a KVLibError saying so (a float or a bool would count a
    fraction of a token, or one)."""
    if not is_int(num_new) or num_new < 1 or length + num_new > max_len:
        raise KVLibError(
            f"cannot add {shown(num_new)} tokens to {length} with max_len {max_len}"[:MAX_MESSAGE]
        )


def check_seq_id(seq_id) -> None:
    """A sequence id is a dict key: a list or another unhashable value is a KVLibError, not a TypeError.

    The block managers keep a block table per sequence id; an unhashable id would otherwise fail
    far from the call that passed it.
    """
    try:
        hash(seq_id)
    except TypeError:
        raise KVLibError(
            f"a sequence id must be hashable (an int or a string), not {shown(seq_id)}"[:MAX_MESSAGE]
        ) from None


def checked_token_ids(token_ids: Sequence[int]) -> Sequence[int]:
    """``token_ids`` itself, once it is checked to be a sequence (a list or tuple the block managers can
    index and read again later, not a generator or a string) of non-negative integers, at least one."""
    if isinstance(token_ids, str | bytes) or not isinstance(token_ids, Sequence):
        kind = type(token_ids).__name__
        raise KVLibError(
            f"token ids must be a list or tuple of integers, not {kind} {shown(token_ids)}"[:MAX_MESSAGE]
        )
    try:
        values = [operator.index(t) for t in token_ids]
    except TypeError:
        raise KVLibError(f"token ids must be integers, not {shown(token_ids)}"[:MAX_MESSAGE]) from None
    if not values:
        raise KVLibError("a sequence needs at least one token")
    if min(values) < 0:
        raise KVLibError(f"token ids must be non-negative, not {min(values)}")
    return token_ids


def check_token_tensor(tokens, name: str, vocab_size: int) -> None:
    """KVLibError unless ``tokens`` is a (batch >= 1, length >= 1) integer tensor of ids in 0..vocab_size - 1.

    Checked at a generate entry point, once: an id outside the vocabulary would otherwise be an
    IndexError from the embedding, a float tensor a RuntimeError from index_select.
    """
    import torch  # here, not at the top: kvlib.checks is imported by modules that never touch torch

    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or 0 in tokens.shape:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise KVLibError(f"{name} must be a (batch >= 1, length >= 1) tensor of token ids, not {shape}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise KVLibError(f"{name} must hold integer token ids, not {tokens.dtype}")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        raise KVLibError(
            f"{name} token ids must lie in 0..{vocab_size - 1} (the vocabulary), not {low}..{high}"
        )
