"""Every exercise is solvable (its reference solution passes) and every check can fail
(each module's WRONG_ANSWERS get a hint, not a pass)."""

import importlib
import pkgutil

import pytest

import kvlib.exercises as exercises
from kvlib import KVLibError

MODULES = sorted(m.name for m in pkgutil.iter_modules(exercises.__path__) if m.name.startswith("ch"))
KEYS = [key for m in MODULES for key in exercises.exercise_keys(int(m[2:]))]


@pytest.mark.parametrize("key", KEYS)
def test_reference_solution_passes(key):
    feedback = exercises.check(key, exercises.solution(key))
    assert feedback.ok, feedback


@pytest.mark.parametrize("key", KEYS)
def test_wrong_answers_get_a_specific_hint(key):
    chapter = key.split(".")[0]
    wrong = importlib.import_module(f"kvlib.exercises.ch{chapter}").WRONG_ANSWERS.get(key)
    assert wrong, f"exercise {key} has no WRONG_ANSWERS to prove its check can fail"
    for answer in wrong:
        feedback = exercises.check(key, answer)
        assert not feedback.ok, f"{key} accepted the wrong answer {answer!r}"
        assert len(feedback.message) > 15 and repr(feedback).startswith("✘")


@pytest.mark.parametrize("chapter", [int(m[2:]) for m in MODULES])
def test_each_chapter_has_three_to_six_exercises(chapter):
    assert 3 <= len(exercises.exercise_keys(chapter)) <= 6


def test_unknown_exercises_are_named():
    with pytest.raises(KVLibError, match="no exercise"):
        exercises.check("99.1", 0)
    with pytest.raises(KVLibError, match="look like"):
        exercises.check("two", 0)
