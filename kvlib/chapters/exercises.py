"""The exercises at the end of every chapter, and the one call that checks a reader's answer.

Each chapter's ``exercises`` module (:mod:`kvlib.chapters.ch04_serving.exercises` for chapter 4)
lists its exercises in ``EXERCISES``, key -> ``(check, solve)``: ``check(answer)`` returns None
when the answer is right, else a hint that names the likely mistake; ``solve()`` is the reference
solution, shown in the chapter's "Worked solution" dropdown with ``literalinclude`` and proven by
:func:`assert_solvable` in a cell the reader does not see (tagged ``remove-cell``), so every build
proves each exercise solvable. No function here hands out an answer: the chapter's first cell
imports :func:`check` and :func:`assert_solvable`, and the solution stays in the dropdown, folded,
until the reader opens it. Its ``FIRST_HINTS`` give the nudge for a blank answer (``answer = ...``)
and its ``WRONG_ANSWERS`` the mistakes the unit tests feed to prove each check can fail.
:data:`CHAPTERS` names every chapter's module, so a tool (or a reader) finds each exercise from here.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from kvlib import KVLibError
from kvlib.chapters.ch00_measurements import exercises as ch00
from kvlib.chapters.ch01_no_cache import exercises as ch01
from kvlib.chapters.ch02_cache_size import exercises as ch02
from kvlib.chapters.ch03_paged_attention import exercises as ch03
from kvlib.chapters.ch04_serving import exercises as ch04
from kvlib.chapters.ch05_levers import exercises as ch05
from kvlib.chapters.ch07_quality import exercises as ch07
from kvlib.chapters.ch08_serving_engines import exercises as ch08
from kvlib.chapters.ch09_mla_absorbed import exercises as ch09
from kvlib.chapters.ch10_window_allocator import exercises as ch10
from kvlib.chapters.ch11_radix_routing import exercises as ch11
from kvlib.chapters.ch12_offload_tier import exercises as ch12
from kvlib.exercises.feedback import Feedback

CHAPTERS: dict[int, ModuleType] = {
    **{0: ch00, 1: ch01, 2: ch02, 3: ch03, 4: ch04, 5: ch05, 7: ch07, 8: ch08},
    **{9: ch09, 10: ch10, 11: ch11, 12: ch12},
}


def _exercise(key) -> tuple[ModuleType, Callable, Callable]:
    """(the chapter's module, check, solve) of exercise ``key``, or a one-line error naming the key."""
    if not isinstance(key, str):  # check(2.1, ...): as a float, 2.1 and 2.10 are one number
        example = f'check("{key}", answer)' if isinstance(key, float) else 'check("2.3", answer)'
        raise KVLibError(f"exercise keys are strings such as '2.3', not {key!r}"[:80] + f": write {example}")
    chapter, dot, number = key.partition(".")
    # ASCII digits only: str.isdigit accepts "²" and "٢"
    if not (dot and chapter.isascii() and chapter.isdigit() and number.isascii() and number.isdigit()):
        raise KVLibError(f"exercise keys look like '2.3', not {key!r}"[:80])
    module = CHAPTERS.get(int(chapter))
    if module is None or key not in module.EXERCISES:
        raise KVLibError(f"there is no exercise {key!r}; see the exercises at the end of chapter {chapter}")
    return (module, *module.EXERCISES[key])


def check(key: str, answer: Any) -> Feedback:
    """Check a reader's answer to exercise ``key`` (e.g. ``"2.3"``).

    Each chapter's exercise cell starts as ``answer = ...``: while the answer is still that blank
    (Python's ``Ellipsis``), the check does not judge it and raises nothing; it says the exercise
    is not answered yet and gives its first hint, so that a reader sees a nudge, never the
    solution, before trying.
    """
    _, judge, _ = _exercise(key)
    if answer is Ellipsis:
        return Feedback(key, False, f"not answered yet. First hint: {first_hint(key)}", answered=False)
    hint = judge(answer)
    if hint is not None:
        hint = " ".join(hint.split())  # one line, even where it quotes a reader's multi-line error
    return Feedback(key, hint is None, "correct." if hint is None else hint)


def first_hint(key: str) -> str:
    """The hint :func:`check` gives for exercise ``key`` before it is answered (``FIRST_HINTS``)."""
    module, _, _ = _exercise(key)
    if key not in module.FIRST_HINTS:
        raise KVLibError(f"exercise {key} has no first hint: add it to FIRST_HINTS in {module.__name__}")
    return module.FIRST_HINTS[key]


def assert_solvable(key: str) -> None:
    """Raise unless exercise ``key``'s reference solution passes its own check (each chapter's hidden
    proof cell calls it): every build proves each exercise solvable without handing the answer to
    the notebook, so the reader's blank is not one call away from the solution."""
    feedback = check(key, _exercise(key)[2]())
    if not feedback.ok:
        raise KVLibError(f"exercise {key}'s reference solution fails its check: {feedback}"[:300])


def exercise_keys(chapter: int) -> list[str]:
    """Keys of every exercise of a chapter, in order (used by the tests)."""
    return sorted(CHAPTERS[chapter].EXERCISES, key=lambda k: tuple(map(int, k.split("."))))
