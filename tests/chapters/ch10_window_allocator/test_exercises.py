"""Chapter 10's exercises beyond tests/test_exercises.py: the answers worked out by hand and the hints
of the usual mistakes."""

import numpy as np
import pytest

from kvlib.chapters.exercises import check


def test_the_answers_worked_out_by_hand_pass():
    # 10.1: ceil(10,007 / 16) = 626 blocks; first kept (10,007 - 4,096 + 1) // 16 = 369; 626 - 369 = 257
    assert check("10.1", 257).ok
    # 10.2: (24,000 - 1,024) // 768 + 1 = 29 + 1 = 30
    assert check("10.2", 30).ok
    # 10.3: 6 x 8,192 / (8,192 + 5 x 1,024) = 49,152 / 13,312 = 3.6923
    assert check("10.3", 49_152 / 13_312).ok
    # 10.4: 512 + 7 x 5 = 547
    assert check("10.4", np.int64(547)).ok


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("10.1", 256, "block boundary"),
        ("10.1", 626, "keeps every block"),
        ("10.2", 31, "until its prefill"),
        ("10.2", 23, "without freeing"),
        ("10.3", 6, "global layer"),
        ("10.4", 512, "Mamba layers keep a state"),
        ("10.4", 519, "5 blocks"),
    ],
)
def test_the_usual_mistakes_get_their_hints(key, answer, hint):
    result = check(key, answer)
    assert not result.ok and hint in str(result)
