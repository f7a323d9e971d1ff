"""How a reader's answer is checked: :func:`check`, :func:`solution` and the hints they print.

:func:`check` finds exercise ``N.k``'s ``check_N_k`` in ``kvlib.exercises.chN`` (imported by
name, so this module imports no chapter) and wraps its verdict in a :class:`Feedback`, printed
as a line starting with ✔ or ✘. :func:`numeric_answer` is what most chapters' checks use: it
recognises the usual wrong numbers and answers each with the hint for that mistake. Used by
the exercises of every chapter (0 to 5).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlib import KVLibError


@dataclass(frozen=True)
class Feedback:
    """Outcome of one check: printed as a line starting with ✔ (right) or ✘ (a hint)."""

    key: str
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return (
            f"✔ Exercise {self.key}: {self.message}" if self.ok else f"✘ Exercise {self.key}: {self.message}"
        )


def numeric_answer(
    answer, expected: float, mistakes: dict, rel: float = 2e-3, what: str = "the formula"
) -> str | None:
    """None if ``answer`` is within ``rel`` of ``expected``; else a known mistake's hint, or a general one.

    ``mistakes`` maps the number a typical mistake produces to the hint for it: the checks
    of every chapter recognise wrong answers by their value, not just reject them.
    """
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return f"answer with a number, not {type(answer).__name__}"
    if abs(answer - expected) <= rel * abs(expected):
        return None
    for value, hint in mistakes.items():
        if abs(answer - value) <= rel * abs(value):
            return hint
    return f"not quite: recompute {what}, one factor at a time"


def _function(key: str, prefix: str) -> Callable:
    chapter, _, number = key.partition(".")
    if not (chapter.isdigit() and number.isdigit()):
        raise KVLibError(f"exercise keys look like '2.3', not {key!r}")
    try:
        module = importlib.import_module(f"kvlib.exercises.ch{chapter}")
        return getattr(module, f"{prefix}_{chapter}_{number}")
    except (ModuleNotFoundError, AttributeError):
        raise KVLibError(
            f"there is no exercise {key!r}; see the exercises at the end of chapter {chapter}"
        ) from None


def check(key: str, answer: Any) -> Feedback:
    """Check a reader's answer to exercise ``key`` (e.g. ``"2.3"``)."""
    hint = _function(key, "check")(answer)
    return Feedback(key, hint is None, "correct." if hint is None else hint)


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
