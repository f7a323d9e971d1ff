"""Chapter 2's exercises beyond tests/test_exercises.py: the answers worked out by hand pass, each
wrong answer of WRONG_ANSWERS gets the hint that names its mistake (not the general one), and the
first hints nudge without giving an answer away."""

import pytest

from kvlib.chapters.ch02_cache_size.exercises import FIRST_HINTS, WRONG_ANSWERS, solve_2_5
from kvlib.chapters.exercises import check, first_hint
from kvlib.units import GiB


def test_the_answers_worked_out_by_hand_pass():
    assert check("2.1", 2 * 80 * 8 * 128 * 8192 * 8 * 2 / GiB).ok  # 20 GiB
    assert check("2.1", 20).ok
    assert check("2.2", 2 * 42 * 8 * 256 * 2).ok  # 344,064 bytes
    assert check("2.3", (21 * 8192 + 21 * 4096) * 2 * 8 * 256 * 2).ok  # 2,113,929,216 bytes
    assert check("2.4", {"fp16": 61, "int4": 195}).ok
    assert check("2.5", solve_2_5()).ok


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("2.1", 160.0, "64 query heads"),
        ("2.1", 10.0, "factor 2 is missing"),
        ("2.1", 2.5, "that is one sequence"),
        ("2.1", 40.0, "not 4"),
        ("2.1", 21.47, "GB of 10^9 bytes"),
        ("2.1", 19, "recompute 2 x layers"),
        ("2.1", "20", "answer with a number"),
        ("2.1", True, "answer with a number"),
        ("2.2", 301_056, "hidden_size/num_attention_heads = 224"),
        ("2.2", 688_128, "16 attention heads"),
        ("2.2", 172_032, "the key and the value"),
        ("2.2", 344_000, "recompute 2 x layers"),
        ("2.3", 2_818_572_288, "every other layer"),
        ("2.3", 1_409_286_144, "odd-numbered ones attend"),
        ("2.3", 1_849_688_064, "head_dim is 256"),
        ("2.3", 2_113_929_215, "recompute the global layers"),
        ("2.4", {"fp16": 61, "int4": 244}, "not exactly 4x smaller"),
        ("2.4", {"fp16": 65, "int4": 195}, "subtract the 4 GiB overhead"),
        ("2.4", {"fp16": 76, "int4": 195}, "the bf16 weights"),
        ("2.4", {"fp16": 61, "int4": 200}, "fp16 is right"),
        ("2.4", [61, 195], "answer with a dict"),
    ],
)
def test_each_wrong_answer_gets_the_hint_that_names_its_mistake(key, answer, hint):
    feedback = check(key, answer)
    assert not feedback.ok and hint in feedback.message, feedback


@pytest.mark.parametrize(
    "index, hint", [(0, "Gemma-2"), (1, "Jamba-v0.1"), (2, "Falcon-7B"), (3, "Llama-2-7B")]
)
def test_each_wrong_config_reader_is_told_which_config_it_gets_wrong(index, hint):
    feedback = check("2.5", WRONG_ANSWERS["2.5"][index])
    assert not feedback.ok and hint in feedback.message, feedback


def test_a_config_reader_that_is_no_function_is_named():
    assert "answer with a function" in check("2.5", 42).message


def test_a_config_reader_that_raises_is_told_where():
    def strict_reader(config):  # right for every config that spells its layers num_hidden_layers
        return solve_2_5()({**config, "num_hidden_layers": config["num_hidden_layers"]})

    feedback = check("2.5", strict_reader)  # Falcon's config says n_layer
    assert not feedback.ok and "raised KeyError" in feedback.message and "Falcon-7B" in feedback.message


@pytest.mark.parametrize("key", sorted(FIRST_HINTS))
def test_the_first_hints_give_no_answer_away(key):
    answers = {"2.1": ["20"], "2.2": ["344,064", "344064"], "2.3": ["2,113,929,216", "2113929216"]}
    answers["2.4"] = ["61", "195"]
    hint = first_hint(key)
    assert not any(a in hint for a in answers.get(key, [])), hint
    assert check(key, ...).message.endswith(hint)


def test_every_exercise_of_the_chapter_has_a_first_hint():
    assert sorted(FIRST_HINTS) == ["2.1", "2.2", "2.3", "2.4", "2.5"]
