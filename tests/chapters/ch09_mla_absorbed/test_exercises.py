"""Chapter 9's exercises: the answers worked out by hand pass, and the usual mistakes get their hint."""

import numpy as np
import pytest

from kvlib.chapters.exercises import check


def test_the_answers_worked_out_by_hand_pass():
    # 9.1: (512 + 64) x 2 bytes x 61 layers = 1,152 x 61 = 70,272
    assert check("9.1", 70_272).ok
    # 9.2: 128 x 2 x (576 + 512) = 278,528 FLOPs over 1,152 bytes = 241.8; ridge 312e12 / 1.555e12 = 200.6
    assert check("9.2", (241.78, True)).ok
    # 9.3: 4,096 x 70,272 = 287,834,112 bytes a sequence; TP: all 64 on every GPU, DP: 8 each
    assert check("9.3", (64 * 287_834_112, 8 * 287_834_112)).ok
    # 9.4: one head adds 2 x (576 + 512) / 1,152 = 1.89 FLOPs per byte; 200.6 / 1.89 = 106.2, so 107 heads
    assert check("9.4", 107).ok and check("9.4", np.int64(107)).ok
    assert check("9.3", [np.int64(18_421_579_776), np.float64(2_302_697_472)]).ok


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("9.1", 1_152, "one layer"),
        ("9.1", 62_464, "rotary key"),
        ("9.1", 140_544, "not a K and a V"),
        ("9.2", (128.0, True), "scores only"),
        ("9.2", (241.78, False), "ridge"),
        ("9.4", 106, "round up"),
        ("9.4", 201, "scores only"),
        ("9.3", (2_302_697_472, 2_302_697_472), "shared by all heads"),
        ("9.3", (18_421_579_776, 18_421_579_776), "splits the batch"),
    ],
)
def test_the_usual_mistakes_get_their_hint(key, answer, hint):
    feedback = check(key, answer)
    assert not feedback.ok and hint in feedback.message, feedback.message
