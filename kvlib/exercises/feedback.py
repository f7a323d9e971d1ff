"""How a reader's answer is checked: :func:`check`, :func:`solution` and the hints they print.

:func:`check` finds exercise ``N.k``'s ``check_N_k`` in ``kvlib.exercises.chN`` (imported by
name, so this module imports no chapter) and wraps its verdict in a :class:`Feedback`, printed
as a line starting with ✔ or ✘. :func:`numeric_answer` is what most chapters' checks use: it
recognises the usual wrong numbers and answers each with the hint for that mistake. Used by
the exercises of every chapter (0 to 5, 7 and 8).
"""

from __future__ import annotations

import importlib
import math
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlib import KVLibError


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


def _function(key: str, prefix: str) -> Callable:
    if not isinstance(key, str):  # check(2.1, ...): as a float, 2.1 and 2.10 are one number
        example = f'check("{key}", answer)' if isinstance(key, float) else 'check("2.3", answer)'
        raise KVLibError(f"exercise keys are strings such as '2.3', not {key!r}"[:80] + f": write {example}")
    if not re.fullmatch(r"[0-9]+\.[0-9]+", key):  # ASCII digits only: str.isdigit accepts "²" and "٢"
        raise KVLibError(f"exercise keys look like '2.3', not {key!r}")
    chapter, _, number = key.partition(".")
    try:
        module = importlib.import_module(f"kvlib.exercises.ch{chapter}")
        return getattr(module, f"{prefix}_{chapter}_{number}")
    except (ModuleNotFoundError, AttributeError):
        raise KVLibError(
            f"there is no exercise {key!r}; see the exercises at the end of chapter {chapter}"
        ) from None


def check(key: str, answer: Any) -> Feedback:
    """Check a reader's answer to exercise ``key`` (e.g. ``"2.3"``).

    Each chapter's exercise cell starts as ``answer = ...``: while the answer is still that blank
    (Python's ``Ellipsis``), the check does not judge it and raises nothing; it says the exercise
    is not answered yet and gives its first hint (the chapter module's ``FIRST_HINTS``), so that a
    reader sees a nudge, never the solution, before trying.
    """
    judge = _function(key, "check")
    if answer is Ellipsis:
        return Feedback(key, False, f"not answered yet. First hint: {first_hint(key)}", answered=False)
    hint = judge(answer)
    return Feedback(key, hint is None, "correct." if hint is None else hint)


def first_hint(key: str) -> str:
    """The hint :func:`check` gives for exercise ``key`` before it is answered (``FIRST_HINTS``)."""
    _function(key, "check")  # names an unknown exercise
    chapter = key.partition(".")[0]
    hints = getattr(importlib.import_module(f"kvlib.exercises.ch{chapter}"), "FIRST_HINTS", {})
    if key not in hints:
        raise KVLibError(
            f"exercise {key} has no first hint: add it to FIRST_HINTS in kvlib/exercises/ch{chapter}.py"
        )
    return hints[key]


def solution(key: str) -> Any:
    """The reference answer to exercise ``key``."""
    return _function(key, "solve")()


def exercise_keys(chapter: int) -> list[str]:
    """Keys of every exercise of a chapter, in order (used by the tests)."""
    module = importlib.import_module(f"kvlib.exercises.ch{chapter}")
    keys = [
        name.removeprefix("check_").replace("_", ".") for name in dir(module) if name.startswith("check_")
    ]
    return sorted(keys, key=lambda k: tuple(map(int, k.split("."))))
