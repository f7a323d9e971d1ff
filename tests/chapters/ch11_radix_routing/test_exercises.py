"""Chapter 11's exercises beyond tests/test_exercises.py: the answers worked out by hand, in the forms a
reader may give them, and the hints of the usual mistakes."""

import numpy as np
import pytest
import torch

from kvlib.chapters.exercises import check


def test_the_answers_worked_out_by_hand_pass():
    # 11.1: 100 shared tokens: 6 whole blocks of 16 = 96 for the hash cache; all 100 for the tree
    assert check("11.1", (96, 100)).ok
    # 11.2: K/V for 70 + 25 - 1 = 94 tokens; 5 whole blocks = 80
    assert check("11.2", (80, 94)).ok
    # 11.3: 30 - 4 = 26 <= 32, so 150 / 200 > 0.5 picks replica 0; 40 - 4 = 36 > 32 picks the least loaded, 1
    assert check("11.3", (0, 1)).ok
    # 11.4: one replica of 4
    assert check("11.4", 0.25).ok


def test_answers_in_list_numpy_or_torch_form_pass():
    assert check("11.1", [np.int64(96), torch.tensor(100)]).ok
    assert check("11.4", np.float64(0.25)).ok and check("11.3", [0, torch.tensor(1)]).ok


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("11.1", (100, 100), "whole blocks"),
        ("11.1", (112, 100), "round down"),
        ("11.1", (96, 96), "every shared token"),
        ("11.2", (80, 95), "last token"),
        ("11.2", (64, 94), "K/V too"),
        ("11.3", (1, 1), "26"),
        ("11.3", (0, 0), "36"),
        ("11.4", 0.75, "elsewhere"),
        ("11.4", 25, "percentage"),
    ],
)
def test_the_usual_mistakes_get_their_hint(key, answer, hint):
    feedback = check(key, answer)
    assert not feedback.ok and hint in feedback.message, feedback.message
