"""How a reader's answer is judged: :class:`Feedback` and the helpers every chapter's checks share.

:func:`kvlib.chapters.exercises.check` wraps a chapter's verdict in a :class:`Feedback`, printed
as a line starting with ✔ or ✘. :func:`numeric_answer` is what most chapters' checks use: it
recognises the usual wrong numbers and answers each with the hint for that mistake. Used by
the exercises of every chapter (0 to 5, 7 and 8).
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class Feedback:
    """Outcome of one check: printed as a line starting with ✔ (right), ✘ (a hint) or … (not answered yet)."""

    key: str
    ok: bool
    message: str
    answered: bool = True  # False while the reader's answer is still the blank ``...``

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        mark = "✔" if self.ok else ("✘" if self.answered else "…")
        return f"{mark} Exercise {self.key}: {self.message}"


def as_number(value) -> int | float | None:
    """``value`` as a Python int or float if it is a real number, else ``None`` (then the check gives a hint).

    Numpy integers and floats, and 0-d arrays or tensors (``np.int64(68)``, ``torch.tensor(68)``),
    are numbers: a reader who computes with numpy or torch gives a right answer in that form.
    A bool is not (``True`` is no count), nor a string, ``None``, a list or a complex number.
    """
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        value = value.item()  # numpy scalars and 0-d arrays, 0-d torch tensors: the Python number inside
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return int(value) if isinstance(value, numbers.Integral) else float(value)


MAX_ITEMS = 10_000  # an answer of more items than this is no list of positions (and an endless iterator ends)


def as_items(value, most: int = MAX_ITEMS) -> list | None:
    """``value``'s items as a list if it is a list, tuple, array, tensor or other iterable of at most
    ``most`` items; else ``None`` (then the check gives a hint).

    A string, bytes or a dict is no list of numbers; a 0-d array or tensor has ``__len__`` and
    ``__iter__`` but raises TypeError from both; ``range(10**20)`` raises OverflowError from
    ``len``, and an endless iterator would hang ``list()``: all of those are answered with a hint.
    """
    if isinstance(value, str | bytes | bytearray | dict) or getattr(value, "ndim", None) == 0:
        return None
    if not hasattr(value, "__iter__"):
        return None
    try:
        items = list(itertools.islice(iter(value), most + 1))
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None
    return items if len(items) <= most else None


def as_float_tensor(value):
    """``value`` as a float64 torch tensor (a tensor, an array, a nested list of numbers), or ``None``.

    ``torch.as_tensor`` raises TypeError, ValueError or RuntimeError for what is not numbers, and
    OverflowError for an int beyond a float (``10**400``): each is answered with a hint, not a traceback.
    """
    import torch  # here: most chapters' checks never need torch

    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


def returned_hint(got, what: str) -> str | None:
    """None if a reader's function returned a number; else a hint saying what it returned instead.

    The checks of exercises answered with a function (0.3, 2.5, 4.5, 5.5) compare what it returns
    with numbers; ``None`` (a forgotten ``return``) or a string would otherwise crash the check.
    """
    if as_number(got) is not None:
        return None
    return f"your function returned {got!r}"[:80] + f" ({type(got).__name__}), not {what}"


def numeric_answer(
    answer, expected: float, mistakes: dict, rel: float = 2e-3, what: str = "the formula"
) -> str | None:
    """None if ``answer`` is within ``rel`` of ``expected``; else a known mistake's hint, or a general one.

    ``mistakes`` maps the number a typical mistake produces to the hint for it: the checks
    of every chapter recognise wrong answers by their value, not just reject them.
    """
    number = as_number(answer)
    if number is None:
        return f"answer with a number, not {type(answer).__name__}"
    if abs(number) > 1e300 or math.isnan(number):  # 1e300 first: an int too large for a float has no NaN test
        return f"{number!r}"[:40] + " is not a usable number: check your arithmetic for a division by zero"
    answer = number
    if abs(answer - expected) <= rel * abs(expected):
        return None
    for value, hint in mistakes.items():
        if abs(answer - value) <= rel * abs(value):
            return hint
    return f"not quite: recompute {what}, one factor at a time"
