"""Checks for the exercises at the end of every chapter.

Each chapter has a module ``kvlib.exercises.chN`` with, for exercise ``N.k``:

- ``check_N_k(answer) -> str | None``: ``None`` when the answer is right, else a hint that
  names the likely mistake (not just "wrong");
- ``solve_N_k()``: the reference solution, shown in the chapter's "Worked solution"
  dropdown with ``literalinclude`` and fed to :func:`check` by the notebook, so every build
  proves each exercise is solvable. Unit tests feed wrong answers to prove each check can fail.

Readers call ``check("N.k", answer)`` with their own answer.
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
    """None if ``answer`` is within ``rel`` of ``expected``; else the hint of a known mistake, or a general one.

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
