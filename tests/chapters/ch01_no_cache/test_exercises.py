"""Chapter 1's exercises beyond tests/test_exercises.py: the answers worked out by hand, every
mistake's hint named by a wrong answer, a reader's cache judged by what it computes, first hints
that do not give the answer, and the run-it-and-interpret exercise 1.6 posed without a check."""

import nbformat
import pytest
import torch

from kvlib.cache.contiguous import ContiguousKVCache
from kvlib.chapters.ch01_no_cache.exercises import _SMALL, ListKVCache
from kvlib.chapters.exercises import check, first_hint
from kvlib.model.attention import grouped_attention
from tests.toc import ROOT

NOTEBOOK = ROOT / "book" / "01_no_cache.ipynb"


def test_the_answers_worked_out_by_hand_pass():
    assert check("1.1", 400 * 401 // 2).ok
    assert check("1.2", 1 + 40e-6 * 401 / (2 * 1.5e-3)).ok  # about 6.35
    assert check("1.3", 2048 * 500_499).ok  # 2,048 bytes per token x (2 + 3 + ... + 1000)
    assert check("1.4", 2 * 32 * 20 * 64 * 1500 * 2).ok  # 245,760,000: the 448 tokens do not count


def test_the_librarys_own_cache_passes_1_5():
    """ContiguousKVCache takes (config, batch_size, max_len) too: any correct cache passes, not one class."""
    assert check("1.5", ContiguousKVCache).ok


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("1.1", 400 * 400, "n x n"),
        ("1.1", 400 * 400 / 2, "half of the diagonal"),
        ("1.1", 400 * 399 / 2, "0 + 1 + ... + (n - 1)"),
        ("1.1", 400, "WITH a cache"),
        ("1.2", 401 / 2, "ratio of tokens processed"),
        ("1.2", 40e-6 * 401 / 3e-3, "add 1"),
        ("1.2", 1 + 40e-6 * 401 / 1.5e-3, "not n + 1"),
        ("1.2", 1 + 40e-6 * 400 / 1.5e-3, "not n + 1 (or n)"),
        ("1.3", 2048 * 500_499 * 3, "6 query heads"),
        ("1.3", 2048 * 500_499 // 2, "a factor 2 is missing"),
        ("1.3", 2048 * 500_499 // 4, "two factors of 2"),
        ("1.3", 2048 * 500_500, "the first step copies nothing"),
        ("1.3", 2048 * 1000 * 1000 / 2, "approximation"),
        ("1.4", 245_760_000 // 1500 * 448, "SELF-attention"),
        ("1.4", 245_760_000 // 1500 * (1500 + 448), "alone"),
        ("1.4", 245_760_000 // 2, "a key AND a value"),
        ("1.4", 245_760_000 * 2, "2 bytes per value"),
        ("1.4", 245_760_000 * 448, "does not grow"),
    ],
)
def test_each_numeric_mistake_gets_its_own_hint(key, answer, hint):
    feedback = check(key, answer)
    assert not feedback.ok and hint in feedback.message, feedback.message


class _PositionsStayAtZero(ListKVCache):
    def prepare(self, num_new):
        super().prepare(num_new)
        return torch.arange(num_new).expand(self.batch_size, num_new)


class _ForgetsThePast(ListKVCache):
    def attend(self, layer, q, k, v):
        super().attend(layer, q, k, v)
        return grouped_attention(q, k, v)


class _OneListForAllLayers(ListKVCache):
    def attend(self, layer, q, k, v):
        return super().attend(0, q, k, v)


class _TheChaptersStub:
    """What the chapter's cell defines before the reader writes anything."""

    def __init__(self, config, batch_size, max_len): ...

    def prepare(self, num_new): ...

    def attend(self, layer, q, k, v): ...


@pytest.mark.parametrize(
    "answer, hint",
    [
        (_PositionsStayAtZero, "prepare must return the positions"),
        (_ForgetsThePast, "the prompt was right but step 1 was not"),
        (_OneListForAllLayers, "the prompt's logits are wrong"),
        (_TheChaptersStub, "prepare must return the positions"),
        (ListKVCache(_SMALL, 1, 4), "answer with the class itself"),
        (lambda config, batch_size, max_len: None, "answer with the class itself"),
    ],
)
def test_cache_mistakes_get_their_hint(answer, hint):
    feedback = check("1.5", answer)
    assert not feedback.ok and hint in feedback.message, feedback.message


@pytest.mark.parametrize(
    "key, leak", [("1.1", "80"), ("1.2", "6.3"), ("1.3", "1,025"), ("1.4", "245"), ("1.5", "ListKVCache")]
)
def test_a_first_hint_does_not_give_the_answer(key, leak):
    assert leak not in first_hint(key)


def test_exercise_1_6_runs_a_knob_the_reader_changes_and_folds_its_explanation():
    """Run it and interpret: a visible code cell with a small default, no check, the explanation folded."""
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    (i,) = [i for i, c in enumerate(cells) if c.cell_type == "code" and "prompt_len = " in c.source]
    knob = cells[i]
    assert "remove-cell" not in knob.metadata.get("tags", []) and "check(" not in knob.source
    assert "prompt_len = 16" in knob.source  # small: a fraction of a second on one CPU thread
    posed = cells[i - 1].source
    assert "**Exercise 1.6** (run it and interpret)." in posed and "predict" in posed
    assert cells[i + 1].source.startswith(":::{dropdown} Worked explanation")
