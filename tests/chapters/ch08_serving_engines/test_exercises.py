"""Chapter 8's exercises beyond tests/test_exercises.py: the answers worked out by hand, in the forms a
reader may give them, and the hints of the mistakes the brief names."""

import numpy as np
import pytest
import torch

from kvlib.chapters.exercises import check


def test_the_answers_worked_out_by_hand_pass():
    # 8.1: TTFT = 10.8 - 10.0 = 0.8 s; TPOT = (12.3 - 10.8) / (31 - 1) = 1.5 / 30 = 0.05 s;
    # the SLO (TTFT <= 1 s and TPOT <= 40 ms): TTFT met, TPOT 50 ms not, so missed
    assert check("8.1", (0.8, 0.05, False)).ok
    # 8.2: 512 - 200 = 312 prompt tokens a step: 312 + 312 + 312 + 64 = 1,000 in 4 steps
    assert check("8.2", 4).ok
    # 8.3: 1 + 0.8 + 0.64 + 0.512 = 2.952 = (1 - 0.8^4) / (1 - 0.8) = 0.5904 / 0.2
    assert check("8.3", 2.952).ok
    # 8.4: TP 4: 8 / 4 = 2 heads, 2 (K, V) x 80 layers x 2 x 128 x 2 bytes = 81,920;
    # TP 16: each head on 16 / 8 = 2 GPUs, 1 head per GPU: 2 x 80 x 1 x 128 x 2 = 40,960
    assert check("8.4", {4: (2, 81_920), 16: (1, 40_960)}).ok
    # 8.5: 2,048 x (2 x 80 x 8 x 128 x 2 = 327,680) = 671,088,640 bytes;
    # 400 Gb/s = 400e9 / 8 = 50e9 bytes/s: 671,088,640 / 50e9 = 0.0134217728 s (13.4 ms)
    assert check("8.5", (671_088_640, 0.0134217728)).ok


def test_answers_in_list_numpy_or_torch_form_pass():
    assert check("8.1", [np.float64(0.8), torch.tensor(0.05), np.bool_(False)]).ok
    assert check("8.4", {4: [np.int64(2), np.int64(81_920)], 16: [torch.tensor(1), torch.tensor(40_960)]}).ok
    assert check("8.5", [np.int64(671_088_640), np.float64(0.0134217728)]).ok


@pytest.mark.parametrize(
    "key, answer, hint",
    [
        ("8.1", (0.8, 1.5 / 31, False), "30 gaps"),  # 31 tokens, not 30 gaps
        ("8.1", (0.8, 2.3 / 31, False), "normalised latency"),  # the paper's measure
        ("8.1", (0.8, 0.05, True), "both targets"),
        ("8.1", (0.8, 0.05, 0), "True or False"),  # 0 is no verdict
        ("8.2", 2, "decodes are scheduled first"),  # ceil(1000 / 512)
        ("8.2", 3, "fourth step"),  # 1000 // 312
        ("8.3", 3 * 0.8, "k x alpha"),
        ("8.3", 0.8 + 0.64 + 0.512, "adds one token of its own"),  # no bonus or correction token
        ("8.3", (1 - 0.8**3) / 0.2, "off by one in the exponent"),  # 2.44
        ("8.4", {4: (2, 81_920), 16: (0.5, 20_480)}, "replicates"),  # 8 heads cut 16 ways
        ("8.4", {4: (2, 81_920), 16: (1, 20_480)}, "K only"),
        ("8.4", {"4": (2, 81_920), "16": (1, 40_960)}, "keyed by the TP size"),
        ("8.5", (671_088_640, 671_088_640 / 400e9), "gigaBITS"),  # 1.68 ms
        ("8.5", (671_088_640, 671_088_640 * 8 / 50e9), "converted twice"),  # 107 ms
        ("8.5", (671_088_640 * 8, 0.0134217728), "in bits"),
    ],
)
def test_the_usual_mistakes_get_their_hint(key, answer, hint):
    feedback = check(key, answer)
    assert not feedback.ok and hint in feedback.message, feedback.message


def test_a_string_or_a_bare_number_is_no_tuple():
    for key, answer in [("8.1", "0.8, 0.05, False"), ("8.5", 671_088_640), ("8.4", None)]:
        feedback = check(key, answer)
        assert not feedback.ok and "answer with a" in feedback.message, feedback.message


def test_kvlibs_scheduler_prefills_the_prompt_of_8_2_in_4_steps():
    """The exercise's rule (decodes first, one token each) is what the chunked-prefill scheduler does."""
    from kvlib.serving.scheduler import SchedulerConfig
    from kvlib.serving.simulator import simulate
    from kvlib.serving.step_time import StepTimeModel
    from kvlib.serving.traces import Request

    decodes = [Request(i, 0.0, (1,), 50) for i in range(200)]  # 200 one-token prompts: decoding from step 2
    prompt = Request(200, 0.5, (1,) * 1000, 2)  # arrives during step 1, joins at step 2 (t = 1 s)
    config = SchedulerConfig(max_num_seqs=256, enable_chunked_prefill=True, max_num_batched_tokens=512)
    run = simulate([*decodes, prompt], "paged", 200 * 64 + 2048, StepTimeModel(1.0, 0, 0, 0), config=config)
    # steps of 1 s each: chunks of 312, 312, 312, 64 at steps 2 to 5; the first token at the end of step 5
    assert run.steps["prefill_tokens"][1:5].tolist() == [312, 312, 312, 64]
    assert run.finished[200].first_token_s - 1.0 == 4
    assert check("8.2", 4).ok


@pytest.mark.parametrize("key", ["8.1", "8.2", "8.3", "8.4", "8.5"])
def test_the_first_hint_nudges_without_giving_the_answer(key):
    """check(key, ...) on the blank shows FIRST_HINTS[key]: none of the answer's numbers may be in it."""
    from kvlib.chapters.ch08_serving_engines.exercises import EXERCISES
    from kvlib.chapters.exercises import first_hint

    def numbers(value):
        if isinstance(value, dict):
            return [n for v in value.values() for n in numbers(v)]
        if isinstance(value, tuple | list):
            return [n for v in value for n in numbers(v)]
        return [] if isinstance(value, bool) else [value]

    hint = first_hint(key)
    for number in numbers(EXERCISES[key][1]()):
        for form in {f"{number:g}", f"{number:,}", f"{number:.3g}"}:
            assert f" {form} " not in f" {hint} ", (key, form, hint)
    assert not check(key, ...).ok and hint in repr(check(key, ...))
