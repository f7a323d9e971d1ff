"""Every exercise is solvable (its reference solution passes) and every check can fail
(each module's WRONG_ANSWERS get a hint, not a pass)."""

import pytest

from kvlib import KVLibError
from kvlib.chapters import exercises

KEYS = [key for chapter in exercises.CHAPTERS for key in exercises.exercise_keys(chapter)]


def _solution(key: str):
    """The reference answer, from the chapter's EXERCISES (kvlib hands no answer out by key)."""
    return exercises.CHAPTERS[int(key.split(".")[0])].EXERCISES[key][1]()


@pytest.mark.parametrize("key", KEYS)
def test_reference_solution_passes(key):
    feedback = exercises.check(key, _solution(key))
    assert feedback.ok, feedback
    exercises.assert_solvable(key)


def test_assert_solvable_names_an_exercise_whose_solution_fails(monkeypatch):
    import kvlib.chapters.ch02_cache_size.exercises as ch2

    check_2_1, _ = ch2.EXERCISES["2.1"]
    monkeypatch.setitem(ch2.EXERCISES, "2.1", (check_2_1, lambda: -1))
    with pytest.raises(KVLibError, match="exercise 2.1's reference solution fails its check"):
        exercises.assert_solvable("2.1")


def test_no_function_hands_out_an_answer_by_key():
    """The reader's first cell imports check and assert_solvable; the answer is not one import away."""
    assert not hasattr(exercises, "solution")


@pytest.mark.parametrize("key", KEYS)
def test_wrong_answers_get_a_specific_hint(key):
    chapter = int(key.split(".")[0])
    wrong = exercises.CHAPTERS[chapter].WRONG_ANSWERS.get(key)
    assert wrong, f"exercise {key} has no WRONG_ANSWERS to prove its check can fail"
    for answer in wrong:
        feedback = exercises.check(key, answer)
        assert not feedback.ok, f"{key} accepted the wrong answer {answer!r}"
        assert len(feedback.message) > 15 and repr(feedback).startswith("✘")


@pytest.mark.parametrize("chapter", list(exercises.CHAPTERS))
def test_each_chapter_has_three_to_six_exercises(chapter):
    assert 3 <= len(exercises.exercise_keys(chapter)) <= 6


def test_unknown_exercises_are_named():
    with pytest.raises(KVLibError, match="no exercise"):
        exercises.check("99.1", 0)
    with pytest.raises(KVLibError, match="look like"):
        exercises.check("two", 0)


def test_numeric_answer_accepts_close_names_known_mistakes_and_rejects_non_numbers():
    from kvlib.exercises.feedback import numeric_answer

    mistakes = {200.0: "you counted K only"}
    assert numeric_answer(400.0, 400.0, mistakes) is None
    assert numeric_answer(400.5, 400.0, mistakes) is None  # within the relative tolerance
    assert numeric_answer(200.0, 400.0, mistakes) == "you counted K only"
    assert "recompute" in numeric_answer(123.0, 400.0, mistakes)
    assert "number" in numeric_answer("400", 400.0, mistakes)
    assert "number" in numeric_answer(True, 400.0, mistakes)


def _notebook_cells(chapter: int) -> list:
    from pathlib import Path

    import nbformat

    (notebook,) = Path(__file__).resolve().parent.parent.joinpath("book").glob(f"{chapter:02d}_*.ipynb")
    return [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]


@pytest.mark.parametrize("chapter", list(exercises.CHAPTERS))
def test_each_chapter_notebook_poses_every_exercise_and_proves_its_solution_out_of_sight(chapter):
    """The reader sees a blank and a check; CI proves the solution in a cell the book does not show,
    and no cell the reader sees (the first cell's imports included) names a reference solution."""
    import re

    cells = _notebook_cells(chapter)
    hidden = [c.source for c in cells if "remove-cell" in c.metadata.get("tags", [])]
    visible = [c.source for c in cells if "remove-cell" not in c.metadata.get("tags", [])]
    for key in exercises.exercise_keys(chapter):
        assert any(f'assert_solvable("{key}")' in src for src in hidden), (
            f"chapter {chapter} does not prove exercise {key} with assert_solvable in a remove-cell cell"
        )
        posed = [src for src in visible if f'check("{key}", ' in src]
        assert posed and all("= ..." in src for src in posed), (
            f"chapter {chapter} must pose exercise {key} with a blank (answer = ...) and check it"
        )
    answers = re.compile(r"\bsolve_\d+_\d+\b|\bsolution\(|assert_solvable\(")
    shown = [match.group() for src in visible for match in [answers.search(src)] if match]
    assert not shown, f"chapter {chapter}'s visible cells name a reference solution: {shown}"


@pytest.mark.parametrize("key", KEYS)
def test_an_unanswered_exercise_gives_its_first_hint_without_judging(key):
    feedback = exercises.check(key, ...)
    assert not feedback.ok and not feedback.answered
    assert feedback.message == f"not answered yet. First hint: {exercises.first_hint(key)}"
    assert repr(feedback).startswith(f"… Exercise {key}: not answered yet")
    assert len(exercises.first_hint(key)) > 20  # a sentence, not a placeholder


def test_a_missing_first_hint_is_named(monkeypatch):
    import kvlib.chapters.ch02_cache_size.exercises as ch2

    monkeypatch.setattr(ch2, "FIRST_HINTS", {})
    with pytest.raises(KVLibError, match="exercise 2.1 has no first hint: add it to FIRST_HINTS"):
        exercises.check("2.1", ...)


# ---------------------------------------------------------------- bad input

FUNCTION_KEYS = ["0.3", "2.5", "3.6", "4.5", "5.5"]  # exercises answered with a function


@pytest.mark.parametrize("key", [2.1, 3, None, ["2.1"]])
def test_a_key_that_is_not_a_string_is_named(key):
    """check(2.1, ...) crashed with AttributeError: a float key is also ambiguous (2.1 == 2.10)."""
    with pytest.raises(KVLibError, match="exercise keys are strings such as '2.3'"):
        exercises.check(key, 0)


def test_a_float_key_is_answered_with_the_string_to_write():
    with pytest.raises(KVLibError, match=r'write check\("2.1", answer\)'):
        exercises.check(2.1, 20.0)


@pytest.mark.parametrize("key", ["٢.١", "².1", "2.1 "])
def test_keys_take_ascii_digits_only(key):
    with pytest.raises(KVLibError, match="look like"):
        exercises.check(key, 0)


def _numeric_keys():
    return [key for key in KEYS if isinstance(_solution(key), int | float)]


@pytest.mark.parametrize("key", _numeric_keys())
def test_a_right_answer_in_numpy_or_torch_form_passes(key):
    """np.int64(68) was rejected with "answer with a number, not int64"."""
    import numpy as np
    import torch

    right = _solution(key)
    forms = [np.float64(right), np.array(right), torch.tensor(right, dtype=torch.float64)]
    if isinstance(right, int):
        forms += [np.int64(right), torch.tensor(right)]
    for form in forms:
        assert exercises.check(key, form).ok, f"{key} rejected its right answer as {type(form).__name__}"


@pytest.mark.parametrize("key", _numeric_keys())
@pytest.mark.parametrize(
    "answer",
    [float("nan"), float("inf"), -float("inf"), 10**400, None, 1j],
    ids=["nan", "inf", "-inf", "10**400", "None", "1j"],
)
def test_unusable_numbers_get_a_hint_not_a_crash(key, answer):
    feedback = exercises.check(key, answer)
    assert not feedback.ok and len(feedback.message) > 15


@pytest.mark.parametrize("key", FUNCTION_KEYS)
@pytest.mark.parametrize("returned", [None, "42", [None], {"a": 1}])
def test_a_function_that_returns_no_number_gets_a_hint(key, returned):
    """2.5, 4.5 and 5.5 crashed (format or comparison errors) when the function returned None or a string."""
    feedback = exercises.check(key, lambda *args, **kwargs: returned)
    assert not feedback.ok
    assert "returned" in feedback.message or "wrong slots" in feedback.message, feedback.message


def test_a_slot_function_that_returns_none_is_told_so():
    """3.6 reported "your function raised TypeError" although the reader's function had raised nothing."""
    feedback = exercises.check("3.6", lambda table, n, block_size: None)
    assert feedback.message == "your function returned None (NoneType), not a list of slots"


@pytest.mark.parametrize("key", FUNCTION_KEYS)
def test_a_right_function_that_returns_numpy_numbers_passes(key):
    import numpy as np

    right = _solution(key)

    def numpy_form(*args):
        value = right(*args)
        return [np.int64(v) for v in value] if isinstance(value, list) else np.float64(value)

    assert exercises.check(key, numpy_form).ok


def _hostile_answers():
    """Values a reader might hand any check by mistake: huge ints, NaN, inf, strings, containers,
    numpy and torch scalars, tensors of the wrong shape, endless iterators, functions that return
    such values or raise a multi-line error. (check("7.3", 10**400) raised OverflowError; a 0-d
    tensor raised TypeError from 3.1 and 7.4; a function returning a (40, 2) tensor, from 3.6.)"""
    import itertools

    import numpy as np
    import torch

    def raises(*args, **kwargs):
        raise ValueError("first line\nsecond line")

    values = [10**400, -(10**400), [10**400] * 3, [[10**400] * 3] * 4, float("nan"), float("inf"), 1e308]
    values += ["x", "68", b"x", None, {}, {"a": 1}, set(), (1,), [], [1, 2], [[1]], True, 0, -1, 2**64, 1j]
    values += [np.int64(5), np.float32("nan"), np.array(np.nan), np.zeros((2, 3)), np.array(["a"]), object()]
    values += [torch.tensor(5), torch.tensor(float("nan")), torch.zeros(0), torch.zeros(2, 3, 4)]
    values += [torch.zeros(3, dtype=torch.bool), range(10**20), itertools.count(), (i for i in range(3))]
    returns = [None, float("nan"), 10**400, "x", [10**400], torch.zeros(0), torch.zeros(40, 2), np.int64(5)]
    values += [lambda *args, _r=r, **kwargs: _r for r in returns]
    values += [raises, lambda x, bits, group_size: x * 1e308]
    return values


@pytest.mark.parametrize("key", KEYS)
def test_any_value_gets_a_one_line_verdict_never_a_traceback(key):
    """check() answers every value with a Feedback on one line (or a one-line KVLibError): no OverflowError,
    TypeError or hang from the check itself, whatever the reader hands it."""
    for answer in _hostile_answers():
        try:
            feedback = exercises.check(key, answer)
        except KVLibError as error:
            assert "\n" not in str(error), (key, answer)
            continue
        assert "\n" not in feedback.message and len(feedback.message) > 5, (key, answer, feedback)


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("7.3", 10**400, "answer with a (4, 3) tensor or nested list of numbers, not int"),
        ("3.1", __import__("torch").tensor(5), "answer with three numbers"),
        ("7.4", __import__("itertools").count(), "answer with a list of positions"),
        ("7.4", range(10**20), "answer with a list of positions"),
    ],
    ids=["7.3 10**400", "3.1 0-d tensor", "7.4 endless iterator", "7.4 range(10**20)"],
)
def test_the_crashes_found_are_hints(key, answer, hint):
    feedback = exercises.check(key, answer)
    assert not feedback.ok and feedback.message.startswith(hint), feedback.message
