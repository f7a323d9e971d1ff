"""Chapter 0's exercises beyond tests/test_exercises.py: the answers worked out by hand, every
mistake's hint named by a wrong answer, and first hints that nudge without giving the answer."""

import statistics

import pytest

from kvlib.chapters.exercises import check, first_hint


def test_the_answers_worked_out_by_hand_pass():
    assert check("0.1", 10.2).ok  # sorted: 10.0, 10.1, 10.2, 10.3, 31.5
    assert check("0.2", 2 * 2**30 / 1555e9 * 1e3).ok  # about 1.381 ms
    assert check("0.2", 1.381).ok  # rounded as the worked solution writes it
    assert check("0.3", lambda slow, fast: min(slow) / min(fast)).ok


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("0.1", statistics.mean([10.2, 10.0, 10.1, 31.5, 10.3]), "that is the mean"),
        ("0.1", 10.0, "fastest sample"),
        ("0.1", 31.5, "slowest sample"),
        ("0.1", 10.1, "sort the samples first"),
        ("0.1", "10.2", "answer with a number"),
        ("0.2", 2e9 / 1555e9 * 1e3, "2**30 bytes"),
        ("0.2", 2 * 2**30 / 1555e9, "in seconds"),
        ("0.2", 2 * 2**30 / 1555e9 * 1e6, "in microseconds"),
        ("0.2", 1555 / 2, "bandwidth over size"),
        ("0.2", 2.0, "recompute bytes divided by bytes per second"),
        ("0.3", lambda slow, fast: statistics.median(slow) / statistics.median(fast), "divides the medians"),
        ("0.3", lambda slow, fast: statistics.mean(slow) / statistics.mean(fast), "divides the means"),
        ("0.3", lambda slow, fast: min(fast) / min(slow), "upside down"),
        ("0.3", lambda slow, fast: slow / fast, "raised TypeError"),
        ("0.3", lambda slow, fast: None, "returned None"),
        ("0.3", 4.0, "answer with a function"),
    ],
)
def test_each_mistake_gets_its_own_hint(key, answer, hint):
    feedback = check(key, answer)
    assert not feedback.ok and hint in feedback.message, feedback.message


@pytest.mark.parametrize("key, leak", [("0.1", "10.2 ms"), ("0.2", "1.38"), ("0.3", "min(")])
def test_a_first_hint_does_not_give_the_answer(key, leak):
    assert leak not in first_hint(key)


def test_the_blank_stub_of_exercise_0_3_gets_the_first_hint_not_a_verdict():
    """The chapter's cell defines a stub speed_ratio but passes the blank; the stub itself is judged."""

    def speed_ratio(slow_samples, fast_samples): ...

    assert not check("0.3", ...).answered
    assert check("0.3", speed_ratio).message.startswith("your function returned None")
