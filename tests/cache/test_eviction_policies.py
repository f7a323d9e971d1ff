"""Tests of kvlib.cache.eviction_policies: each policy's kept set on hand-made examples, and bad arguments."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.cache.eviction_policies import H2O, SlidingWindow, StreamingLLM, eviction_policy

TEN = list(range(10))  # positions 0 .. 9 held


def test_sliding_window_keeps_the_last_budget_tokens():
    assert SlidingWindow(3).kept_positions(TEN) == [7, 8, 9]
    assert SlidingWindow(1).kept_positions(TEN) == [9]
    assert SlidingWindow(3).kept_positions([0, 4, 5, 11]) == [4, 5, 11]  # held after earlier evictions
    assert SlidingWindow(10).kept_positions(TEN) == TEN  # budget = held: keep all
    assert SlidingWindow(50).kept_positions([2, 3]) == [2, 3]


def test_streaming_llm_keeps_sinks_and_the_last_tokens():
    assert StreamingLLM(5, num_sinks=2).kept_positions(TEN) == [0, 1, 7, 8, 9]  # 2 sinks + last 5 - 2
    assert StreamingLLM(6).kept_positions(TEN) == [0, 1, 2, 3, 8, 9]  # 4 sinks by default + last 2
    assert StreamingLLM(3, num_sinks=0).kept_positions(TEN) == [7, 8, 9]  # no sinks: the window
    assert StreamingLLM(3, num_sinks=3).kept_positions(TEN) == [0, 1, 2]  # sinks only
    assert StreamingLLM(4, num_sinks=1).kept_positions([0, 1, 2]) == [0, 1, 2]  # fits: all
    assert StreamingLLM(4, num_sinks=2).kept_positions([0, 1, 6, 7, 8]) == [0, 1, 7, 8]


def test_h2o_keeps_the_recent_tokens_and_the_heaviest_older_ones():
    scores = [5.0, 1.0, 3.0, 3.0, 0.0, 0.5, 0.1]  # positions 0 .. 6
    # recent 2: positions 5, 6 whatever their scores; 2 heavy among 0..4: 0 (5.0), then 2 and 3 tie
    # at 3.0 and the earlier, 2, wins
    assert H2O(4, recent=2).kept_positions(range(7), scores) == [0, 2, 5, 6]
    assert H2O(4, recent=0).kept_positions(range(7), scores) == [0, 1, 2, 3]  # on score: 5.0, 3.0, 3.0, 1.0
    assert H2O(3, recent=3).kept_positions(range(7), scores) == [4, 5, 6]  # the window
    assert H2O(3, recent=1).kept_positions([1, 4, 9, 12], [0.2, 0.9, 0.8, 0.0]) == [4, 9, 12]
    assert H2O(9, recent=2).kept_positions(range(7), scores) == list(range(7))  # fits: all


def test_h2o_keeps_one_set_per_sequence():
    scores = torch.tensor([[1.0, 0.0, 2.0, 0.0, 0.0], [0.0, 3.0, 1.0, 0.0, 0.0]])
    # budget 3, recent 1: slot 4 and the two heaviest of slots 0..3 in each row
    assert H2O(3, recent=1).keep_indices(scores).tolist() == [[0, 2, 4], [1, 2, 4]]


def test_window_policies_keep_the_same_slots_in_every_sequence():
    scores = torch.zeros(2, 6)
    assert StreamingLLM(4, num_sinks=1).keep_indices(scores).tolist() == [[0, 3, 4, 5]] * 2
    assert SlidingWindow(2).keep_indices(scores).tolist() == [[4, 5]] * 2


def test_eviction_policy_by_name():
    assert eviction_policy("window", 8) == SlidingWindow(8)
    assert eviction_policy("sinks", 8) == StreamingLLM(8, 4)
    assert eviction_policy("sinks", 8, num_sinks=1) == StreamingLLM(8, 1)
    assert eviction_policy("h2o", 9) == H2O(9, 4)  # half the budget, rounded down, is recent
    assert eviction_policy("h2o", 8, recent=2) == H2O(8, 2)


@pytest.mark.parametrize("budget", [0, -3, 2.5, True])
def test_a_budget_that_is_not_a_positive_integer_is_refused(budget):
    for make in (SlidingWindow, StreamingLLM, lambda b: H2O(b, 0)):
        with pytest.raises(KVLibError, match="budget must be a positive integer"):
            make(budget)
    with pytest.raises(KVLibError, match="budget must be a positive integer"):
        eviction_policy("h2o", budget)


def test_bad_policy_arguments_get_one_line_errors():
    with pytest.raises(KVLibError, match=r"num_sinks \(5\) exceeds the budget \(4\)"):
        StreamingLLM(4, num_sinks=5)
    with pytest.raises(KVLibError, match=r"recent \(5\) exceeds the budget \(4\)"):
        H2O(4, recent=5)
    with pytest.raises(KVLibError, match="num_sinks must be an integer >= 0"):
        StreamingLLM(4, num_sinks=-1)
    with pytest.raises(KVLibError, match="recent must be an integer >= 0"):
        H2O(4, recent=-1)
    with pytest.raises(KVLibError, match="unknown eviction policy 'lru'"):
        eviction_policy("lru", 4)
    with pytest.raises(KVLibError, match="distinct and ascending"):
        SlidingWindow(2).kept_positions([3, 1, 2])
    with pytest.raises(KVLibError, match="2 scores for 3 positions"):
        H2O(2, 1).kept_positions([0, 1, 2], [1.0, 2.0])
    with pytest.raises(KVLibError, match=r"\(batch, held\) tensor"):
        H2O(2, 1).keep_indices(torch.zeros(3))


@settings(max_examples=200, deadline=None)
@given(
    scores=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    budget=st.integers(1, 14),
    recent=st.integers(0, 14),
)
def test_h2o_matches_its_definition_written_out(scores, budget, recent):
    # small integer scores make ties common; the definition: the last `recent` positions, plus the
    # `budget - recent` older ones ranked by (larger score, earlier position)
    recent = min(recent, budget)
    held = len(scores)
    if held <= budget:
        expected = list(range(held))
    else:
        old = sorted(range(held - recent), key=lambda i: (-scores[i], i))[: budget - recent]
        expected = sorted(old) + list(range(held - recent, held))
    assert H2O(budget, recent).kept_positions(range(held), [float(s) for s in scores]) == expected
