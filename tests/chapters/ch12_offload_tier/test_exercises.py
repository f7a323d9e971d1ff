"""Chapter 12's exercises beyond tests/test_exercises.py: the answers worked out by hand, in the forms a
reader may give them, and the hints of the usual mistakes."""

import numpy as np
import pytest
import torch

from kvlib.chapters.exercises import check


def test_the_answers_worked_out_by_hand_pass():
    # 12.1: ceil(1000 / 16) = 63 blocks x 40 layers x 2 (K, V) = 5,040 calls; gathered 40 x 2 = 80
    assert check("12.1", (5040, 80)).ok
    # 12.2: 4,096 x (2 x 32 x 8 x 128 x 2 = 131,072) = 536,870,912 bytes / 50e9 = 0.01073741824 s
    assert check("12.2", 0.01073741824).ok
    # 12.3: 2 x (30 + 2 x 40 x 5 / B) = 80 -> 800 / B = 20 -> B = 40
    assert check("12.3", 40).ok
    # 12.4: 16 x 131,072 = 2,097,152 bytes a block; 10e9 // 2,097,152 = 4,768
    assert check("12.4", 4768).ok


def test_answers_in_list_numpy_or_torch_form_pass():
    assert check("12.1", [np.int64(5040), torch.tensor(80)]).ok
    assert check("12.2", np.float64(0.01073741824)).ok and check("12.4", torch.tensor(4768)).ok


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("12.1", (2520, 40), "K only"),
        ("12.1", (4960, 80), "round up"),  # 1000 // 16 = 62 blocks
        ("12.1", (5040, 2), "its own tensor"),
        ("12.2", 4096 * 131_072 * 8 / 50e9, "bits"),
        ("12.2", 4096 * 131_072 / (50 * 2**30), "decimal"),
        ("12.3", 8.0, "one direction"),  # 30 + 400 / B = 80
        ("12.3", 20.0, "half the calls"),
        ("12.4", 5120, "GiB"),  # 10 x 2^30 / 2^21
        ("12.4", 4769, "round down"),
    ],
)
def test_the_usual_mistakes_get_their_hint(key, answer, hint):
    feedback = check(key, answer)
    assert not feedback.ok and hint in feedback.message, feedback.message
