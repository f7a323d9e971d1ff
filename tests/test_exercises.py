"""Every exercise is solvable (its reference solution passes) and every check can fail
(each module's WRONG_ANSWERS get a hint, not a pass)."""

import importlib
import pkgutil

import pytest

import kvlib.exercises as exercises
from kvlib import KVLibError

MODULES = sorted(
    m.name for m in pkgutil.iter_modules(exercises.__path__) if m.name[:2] == "ch" and m.name[2:].isdigit()
)
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


def test_numeric_answer_accepts_close_names_known_mistakes_and_rejects_non_numbers():
    from kvlib.exercises import numeric_answer

    mistakes = {200.0: "you counted K only"}
    assert numeric_answer(400.0, 400.0, mistakes) is None
    assert numeric_answer(400.5, 400.0, mistakes) is None  # within the relative tolerance
    assert numeric_answer(200.0, 400.0, mistakes) == "you counted K only"
    assert "recompute" in numeric_answer(123.0, 400.0, mistakes)
    assert "number" in numeric_answer("400", 400.0, mistakes)
    assert "number" in numeric_answer(True, 400.0, mistakes)


@pytest.mark.parametrize("chapter", [int(m[2:]) for m in MODULES])
def test_each_chapter_notebook_checks_every_reference_solution(chapter):
    """CI proves an exercise solvable only if its chapter calls its check with the solution."""
    from pathlib import Path

    (notebook,) = Path(__file__).resolve().parent.parent.joinpath("book").glob(f"{chapter:02d}_*.ipynb")
    text = notebook.read_text(encoding="utf-8")
    for key in exercises.exercise_keys(chapter):
        assert f'check(\\"{key}\\", solution(\\"{key}\\"))' in text, (
            f"{notebook.name} does not check exercise {key}"
        )
