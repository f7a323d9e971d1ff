"""Chapter 7's exercises beyond tests/test_exercises.py: the answers worked out by hand, and the
reader's quantizer (7.5) judged by what it returns, whatever form it takes."""

import numpy as np
import pytest
import torch

from kvlib.chapters.exercises import check
from kvlib.quant.minmax import quantize_minmax


def test_the_answers_worked_out_by_hand_pass():
    # 7.1: per vector 16 x 4 bits = 8 bytes of codes + 2 groups x (2 + 2) bytes; K and V, 4 layers, 8 heads
    assert check("7.1", 2 * 4 * 8 * (8 + 2 * 4)).ok
    # 7.2: keys 16 channels x (32 + 4) bytes per 128 tokens = 4.5 a token, values 4 + 4 = 8;
    # 384 tokens quantized, 116 in fp16 at 2 x 16 x 2 = 64 bytes; 32 heads and layers, over 500 tokens
    assert check("7.2", 32 * (384 * (4.5 + 8) + 116 * 64) / 500).ok
    # 7.3: rows of heads 0 and 1 averaged, then of heads 2 and 3
    assert check("7.3", [[3, 1, 0], [0, 2, 1], [1, 1, 1], [2, 0, 2]]).ok
    # 7.4: sinks 0..3, then positions 260..383: of the register 1..24, only 1, 2, 3
    assert check("7.4", [3, 2, 1]).ok  # any order


def test_answers_in_numpy_or_torch_form_pass():
    assert check("7.3", np.array([[3, 1, 0], [0, 2, 1], [1, 1, 1], [2, 0, 2]])).ok
    assert check("7.4", torch.tensor([1, 2, 3])).ok
    assert check("7.4", np.array([1, 2, 3])).ok


def test_a_string_of_digits_is_no_list_of_positions():
    """Iterating "123" gives 1, 2, 3: without the guard it would pass."""
    feedback = check("7.4", "123")
    assert not feedback.ok and "list of positions" in feedback.message


def test_kvlibs_own_quantizer_and_a_numpy_returning_one_pass_7_5():
    """kvlib's fp16 scale and zero point stay within the check's margin of half a step."""
    assert check("7.5", lambda x, bits, g: quantize_minmax(x, bits, g).dequantize()).ok
    assert check("7.5", lambda x, bits, g: quantize_minmax(x, bits, g).dequantize().numpy()).ok


def _wrong_levels(x, bits, group_size):
    """2**bits steps across the range instead of 2**bits - 1: one value more than the bits hold."""
    groups = x.reshape(*x.shape[:-1], -1, group_size)
    low = groups.amin(dim=-1, keepdim=True)
    scale = ((groups.amax(dim=-1, keepdim=True) - low) / 2**bits).clamp(min=1e-12)
    return (((groups - low) / scale).round() * scale + low).reshape(x.shape)


def _one_scale_per_vector(x, bits, group_size):
    low = x.amin(dim=-1, keepdim=True)
    scale = ((x.amax(dim=-1, keepdim=True) - low) / (2**bits - 1)).clamp(min=1e-12)
    return ((x - low) / scale).round() * scale + low


@pytest.mark.parametrize(
    "answer, hint",
    [
        (lambda x, bits, g: quantize_minmax(x, bits, g).codes(), "those are the codes"),
        (_wrong_levels, "5 different values; 2 bits give at most 4"),
        (_one_scale_per_vector, "off by more than half a step"),
        (lambda x, bits, g: x[..., :g], "came back as shape"),
        (lambda x, bits, g: 1 / 0, "raised ZeroDivisionError"),
        (lambda x, bits, g: "x", "returned str"),
    ],
)
def test_quantizer_mistakes_get_their_hint(answer, hint):
    feedback = check("7.5", answer)
    assert not feedback.ok and hint in feedback.message, feedback.message


def test_a_right_quantizer_that_scribbles_on_its_input_still_passes():
    """The check compares with its own copy of x, not with what the reader's function left in it."""

    def in_place(x, bits, g):
        y = quantize_minmax(x, bits, g).dequantize()
        x.zero_()  # the reader's function may reuse its input as scratch space
        return y

    assert check("7.5", in_place).ok


@pytest.mark.parametrize("key", ["7.1", "7.2", "7.4"])
def test_the_first_hint_nudges_without_giving_the_answer(key):
    """check(key, ...) on the blank shows FIRST_HINTS[key]: the answer may not be in it."""
    from kvlib.chapters.ch07_quality.exercises import EXERCISES
    from kvlib.chapters.exercises import first_hint

    hint, answer = first_hint(key), EXERCISES[key][1]()
    if isinstance(answer, list):  # 7.4: the positions, alone or as the list
        forms = {str(answer), *(str(n) for n in answer)}
    else:  # 7.1 and 7.2: the number of bytes, as the worked solution writes it or rounded
        forms = {f"{answer:g}", f"{answer:,.0f}", f"{answer:.0f}"}
    assert not any(f" {form} " in f" {hint} " for form in forms), (key, forms, hint)
    assert not check(key, ...).ok and hint in repr(check(key, ...))
