"""Chapter 4's exercises beyond tests/test_exercises.py: the answers worked out by hand, the hint each
usual mistake gets, and exercise 4.6's preemption policy run in the simulator."""

import math
import random

import numpy as np
import pytest

import kvlib.chapters.ch04_serving.exercises as ch4
import kvlib.chapters.ch04_serving.preemption_exercise as ch4_impl
from kvlib.chapters.ch04_serving import policy_comparison as pc
from kvlib.chapters.exercises import check
from kvlib.serving import roofline as gpu_model
from kvlib.serving.simulator import simulate
from kvlib.serving.traces import SHAREGPT, make_trace


def test_the_answers_worked_out_by_hand_pass():
    # 4.1: (int(0.9 x 24 x 2^30) = 23,192,823,398 - 2 x 6,738,415,616) // (2 x 32 x 32 x 128 x 2 x 16 = 8 MiB)
    #      = 9,715,992,166 // 8,388,608 = 1,158
    assert check("4.1", 1158).ok
    # 4.2: pow2 asks 300 + 512 = 812, the buddy block is 1,024, the request fills 600: 424 stay empty
    assert check("4.2", 424).ok
    # 4.3: mean of (100 + k) / 500 for k = 1..400: (100 + 200.5) / 500
    assert check("4.3", 0.601).ok
    # 4.4: the larger of memory (16.5 ms + 0.53 µs per cached token) and compute (82 µs per sequence):
    # 30 / max(16.5 + 7.95, 2.46) ms over 15 / max(16.5 + 3.975, 1.23) ms = 1.2270 / 0.7326
    assert check("4.4", 1.675).ok

    # 4.5: a loop instead of bit_length
    def pow2_slots(prompt_len, output_len, max_len):
        power = 1
        while power < output_len:
            power *= 2
        return min(max_len, prompt_len + power)

    assert check("4.5", pow2_slots).ok
    # 4.6: the youngest of the longest, written with a key of (length, arrival, id) instead of reversed()
    assert check(
        "4.6", lambda running: max(running, key=lambda s: (len(s.tokens), s.request.arrival_s, s.seq_id))
    ).ok


@pytest.mark.parametrize("key", [f"4.{k}" for k in range(1, 7)])
def test_each_exercise_has_a_first_hint_that_gives_no_answer(key):
    hint = ch4.FIRST_HINTS[key]
    assert len(hint) > 20
    right = ch4.EXERCISES[key][1]()
    if not callable(right):
        assert f"{right:g}" not in hint and str(round(right, 3)) not in hint


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("4.1", 1465, "90%"),
        ("4.1", 968, "2^30"),
        ("4.1", 2316, "factor 2"),
        ("4.1", 18528, "in tokens"),
        ("4.2", 212, "power of two: 1024"),
        ("4.2", 1024, "whole block"),
        ("4.2", 724, "true total length"),
        ("4.2", 1448, "max reserves"),
        ("4.3", 0.5, "from the start"),
        ("4.3", 0.399, "empty fraction"),
        ("4.3", 60.1, "percentage"),
        ("4.4", 2.0, "reads twice the cache"),
        ("4.4", 0.6, "oracle over paging"),
        ("4.4", 1.613, "not their sum"),  # memory time plus compute time: the summed model
        ("4.4", 1.0, "LARGER of its two times"),  # the compute time alone
        ("4.4", 1.002, "0.53e-6"),
        ("4.4", 0.837, "one token per running request"),  # the step times' inverse ratio
        ("4.5", lambda p, o, m: min(m, p + o), "oracle's reservation"),
        ("4.5", lambda p, o, m: p + (1 << (o - 1).bit_length()), "cap it"),
        ("4.6", lambda running: running[-1], "first come, first served's rule"),
        ("4.6", lambda running: running[0], "asks for the slot itself"),
        ("4.6", lambda running: max(running, key=lambda s: len(s.tokens)), "wrong tie"),
        ("4.6", lambda running: min(running, key=lambda s: len(s.tokens)), "SHORTEST"),
        (
            "4.6",
            lambda running: max(reversed(running), key=lambda s: s.request.prompt_len),
            "generated tokens too",
        ),
        ("4.6", lambda running: max(reversed(running), key=lambda s: s.num_generated), "prompt too"),
        ("4.6", lambda running: max(reversed(running), key=lambda s: s.request.total_len), "WILL reach"),
        ("4.6", lambda running: random.choice(running), "must be a rule"),
        ("4.6", lambda running: len(running) - 1, "not its position"),
        ("4.6", lambda running: running.pop(), "do not remove it yourself"),
        ("4.6", lambda running: None, "not one of the requests in running"),
        (
            "4.6",
            lambda running: max(reversed(running), key=lambda s: (len(s.tokens) + 14) // 16),
            "blocks of 16",
        ),
        ("4.6", "longest", "answer with a function"),
    ],
)
def test_the_usual_mistakes_get_their_hint(key, answer, hint):
    feedback = check(key, answer)
    assert not feedback.ok and hint in feedback.message, feedback.message


def test_4_6_a_policy_right_on_the_hand_made_cases_is_still_graded_by_the_simulator():
    """The hand-made cases do not decide alone: a rule that agrees on them but not on the trace fails."""
    longest = ch4.solve_4_6()
    # the rule with at most 4 candidates, as in every hand-made case; FCFS's youngest with more
    feedback = check("4.6", lambda running: longest(running) if len(running) <= 4 else running[-1])
    assert not feedback.ok and "on the check's trace your policy preempts" in feedback.message, (
        feedback.message
    )
    assert "where the rule preempts 15" in feedback.message


def test_4_6_the_trace_tells_the_rule_from_fcfs():
    """The check's trace: FCFS preempts 30 times, the longest-first rule 15 (the module's comment)."""
    assert ch4_impl._outcome(None)[1] == 30
    assert ch4_impl._outcome(ch4.solve_4_6())[1] == 15


def test_4_6_what_the_worked_solution_says_about_the_chapters_trace():
    """The worked solution's numbers: the chapter's 1,000 ShareGPT-like requests, paged, queued at once."""
    budget = gpu_model.kv_budget("OPT-13B")
    requests = make_trace(SHAREGPT, 1000, math.inf, seed=0)
    prompts = sum(r.prompt_len for r in requests)
    runs = {
        name: simulate(requests, "paged", budget.num_slots, pc.ONE_PER_STEP, SHAREGPT.max_len, victim=victim)
        for name, victim in (("fcfs", None), ("longest", ch4.solve_4_6()))
    }
    fcfs, longest = runs["fcfs"], runs["longest"]
    assert (fcfs.num_preemptions, longest.num_preemptions) == (983, 405)
    recomputed = {n: int(r.steps["prefill_tokens"].sum()) - prompts for n, r in runs.items()}
    assert recomputed == {"fcfs": 198_331, "longest": 285_802}
    assert (np.median(fcfs.preempted_generated), np.median(longest.preempted_generated)) == (26, 105)
    assert (len(fcfs.steps["num_seqs"]), len(longest.steps["num_seqs"])) == (12_223, 12_427)
    roofline = gpu_model.roofline_step_model("OPT-13B")
    rates = {n: r.retimed(roofline).requests_per_s for n, r in runs.items()}
    assert rates["fcfs"] == pytest.approx(3.38, abs=0.005) and rates["longest"] == pytest.approx(
        3.26, abs=0.005
    )
