"""Exercises of chapter 8 (Serving as engines do it now): one request's TTFT and TPOT against an SLO,
the steps of a chunked prefill, the tokens a speculative pass yields, a Llama-3-70B's K/V per GPU
under tensor parallelism, and what disaggregated prefill sends over the network.

Each ``check_8_k`` computes the expected answer with kvlib where kvlib has it
(:mod:`kvlib.serving.results` and :mod:`kvlib.serving.latency` for 8.1, :mod:`kvlib.sizing.parallel`
for 8.4, :mod:`kvlib.chapters.ch08_serving_engines.disaggregation` for 8.5), never typed in, and recognises
the usual
mistakes by the answers they produce.
"""

from __future__ import annotations

import math

import numpy as np

from kvlib.chapters.ch08_serving_engines.disaggregation import LINKS, pd_transfer
from kvlib.exercises.feedback import (  # a number checked against the mistakes it is known for
    as_number,
    numeric_answer,
)
from kvlib.serving.latency import goodput
from kvlib.serving.results import RunResult
from kvlib.serving.traces import Request
from kvlib.serving.types import SeqState
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.parallel import kv_heads_per_gpu, per_gpu_bytes

# ---- 8.1 one request's TTFT and TPOT, and the SLO

ARRIVAL_S, FIRST_TOKEN_S, LAST_TOKEN_S = 10.0, 10.8, 12.3  # the request of exercise 8.1 (seconds)
NUM_OUTPUT_TOKENS = 31  # its output tokens
TTFT_SLO_S, TPOT_SLO_S = 1.0, 0.040  # the targets: TTFT <= 1 s and TPOT <= 40 ms


def solve_8_1() -> tuple[float, float, bool]:
    """TTFT from the arrival; TPOT over the 30 gaps after the first token; the SLO needs both."""
    ttft = 10.8 - 10.0
    tpot = (12.3 - 10.8) / (31 - 1)
    return ttft, tpot, ttft <= 1.0 and tpot <= 0.040


def _one_request_run() -> RunResult:
    """The request of 8.1 as a finished run, so that kvlib's own TTFT, TPOT and goodput read it."""
    request = Request(0, ARRIVAL_S, (1,), NUM_OUTPUT_TOKENS)
    state = SeqState(request, [1] * (1 + NUM_OUTPUT_TOKENS), NUM_OUTPUT_TOKENS)
    state.first_token_s, state.finish_s = FIRST_TOKEN_S, LAST_TOKEN_S
    steps = {"start_s": np.array([LAST_TOKEN_S]), "duration_s": np.array([0.0])}  # (1,) each: the last step
    return RunResult("paged", 1, [state], steps, 0)


def _parts(answer, size: int) -> list | None:
    """``answer`` as a list of ``size`` parts if it is a tuple or list of that length, else None."""
    if not isinstance(answer, tuple | list) or len(answer) != size:
        return None
    return list(answer)


def check_8_1(answer):
    """Exercise 8.1: (TTFT, TPOT, meets the SLO) of one request, as vLLM defines TTFT and TPOT.

    None if right, else a hint that names the likely mistake.
    """
    form = "answer with a tuple (ttft_s, tpot_s, meets_slo): two numbers of seconds and True or False"
    parts = _parts(answer, 3)
    if parts is None:
        return form
    ttft, tpot, meets = parts
    run = _one_request_run()
    total, after_first = LAST_TOKEN_S - ARRIVAL_S, LAST_TOKEN_S - FIRST_TOKEN_S
    hint = numeric_answer(
        ttft,
        float(run.ttft_s[0]),
        {
            FIRST_TOKEN_S: "that is the first token's clock time; TTFT counts from the request's arrival",
            total: "that is the whole request, to its last token; TTFT stops at the first token",
            after_first: "that is the time after the first token; TTFT is the wait before it",
            1e3 * float(run.ttft_s[0]): "that is in milliseconds; answer in seconds",
        },
        rel=1e-6,
        what="first token - arrival",
    )
    if hint:
        return f"TTFT: {hint}"
    hint = numeric_answer(
        tpot,
        float(run.tpot_s[0]),
        {
            after_first / NUM_OUTPUT_TOKENS: (
                "31 tokens leave 30 gaps: the first token's wait is TTFT's, so TPOT divides by output - 1"
            ),
            total / NUM_OUTPUT_TOKENS: (
                "that is the vLLM paper's normalised latency (arrival to last token over all tokens), "
                "not TPOT, which starts at the first token"
            ),
            total / (NUM_OUTPUT_TOKENS - 1): "TPOT starts at the first token, not at the arrival",
            after_first: "that is the whole decode; divide it by the 30 tokens after the first",
            1e3 * float(run.tpot_s[0]): "that is in milliseconds; answer in seconds",
        },
        rel=1e-6,
        what="(last token - first token) / (output tokens - 1)",
    )
    if hint:
        return f"TPOT: {hint}"
    if not isinstance(meets, bool | np.bool_):
        return f"meets_slo is True or False, not {type(meets).__name__}"
    if bool(meets) != (goodput(run, TTFT_SLO_S, TPOT_SLO_S).num_good == 1):
        return (
            "TTFT and TPOT are right; a request meets the SLO only when it meets both targets "
            "(TTFT <= 1 s and TPOT <= 40 ms): compare each"
        )
    return None


# ---- 8.2 a chunked prefill

TOKEN_BUDGET, NUM_DECODES, CHUNKED_PROMPT_LEN = (
    512,
    200,
    1000,
)  # max_num_batched_tokens; running decodes; prompt


def solve_8_2() -> int:
    """Each step the 200 decodes take 200 of the 512 tokens; the prompt gets the other 312."""
    chunk = 512 - 200
    return math.ceil(1000 / chunk)  # 312 + 312 + 312 + 64


def _prefill_steps(budget: int, num_decodes: int, prompt_len: int) -> int:
    """Steps until the prompt is prefilled, decodes scheduled first at one token each."""
    steps, left = 0, prompt_len
    while left > 0:
        left -= budget - num_decodes  # the budget's rest after the decodes: this step's chunk
        steps += 1
    return steps


def check_8_2(answer):
    """Exercise 8.2: steps a 1,000-token prompt takes to prefill beside 200 decodes in a 512-token budget.

    None if right, else a hint that names the likely mistake.
    """
    chunk = TOKEN_BUDGET - NUM_DECODES
    return numeric_answer(
        answer,
        _prefill_steps(TOKEN_BUDGET, NUM_DECODES, CHUNKED_PROMPT_LEN),
        {
            math.ceil(CHUNKED_PROMPT_LEN / TOKEN_BUDGET): (
                "the 200 decodes are scheduled first and take one token each of the 512: chunks get 312"
            ),
            CHUNKED_PROMPT_LEN
            / TOKEN_BUDGET: "the decodes take 200 of the 512 tokens first, and steps are whole",
            CHUNKED_PROMPT_LEN
            / chunk: "steps are whole: a last chunk of 64 tokens still takes a step (round up)",
            CHUNKED_PROMPT_LEN
            // chunk: "three chunks of 312 leave 64 tokens: they take a fourth step (round up)",
            CHUNKED_PROMPT_LEN / NUM_DECODES: (  # also 4 steps + 1 for the first token
                "a chunk is what the decodes leave of the budget, 512 - 200 = 312 tokens, not 200 (and the "
                "step of the last chunk already yields the first token)"
            ),
        },
        rel=1e-9,
        what="ceil(prompt / (budget - decodes))",
    )


# ---- 8.3 speculative decoding's tokens per pass

NUM_DRAFT_TOKENS, ACCEPTANCE_RATE = 3, 0.8  # k, and alpha: each draft token accepted with probability 0.8


def solve_8_3() -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): the accepted prefix of the drafts, plus the target's own token."""
    alpha, k = 0.8, 3
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def check_8_3(answer):
    """Exercise 8.3: expected tokens per target pass with k = 3 drafts accepted i.i.d. at alpha = 0.8.

    None if right, else a hint that names the likely mistake.
    """
    alpha, k = ACCEPTANCE_RATE, NUM_DRAFT_TOKENS
    # token i + 1 of the pass comes out when the first i drafts are all accepted: P = alpha^i
    expected = sum(alpha**i for i in range(k + 1))
    return numeric_answer(
        answer,
        expected,
        {
            k * alpha: (
                "k x alpha counts each draft as if it were accepted on its own; a rejection discards the "
                "drafts after it (draft i survives with probability alpha^i), and the pass adds a token"
            ),
            1 + k * alpha: (
                "a rejected draft discards every draft after it: draft i survives with probability "
                "alpha^i, not alpha"
            ),
            expected - 1: (
                "that counts the accepted drafts only; the target's pass always adds one token of its "
                "own (the correction at the first rejection, or a bonus token when all are accepted)"
            ),
            (1 - alpha**k) / (1 - alpha): (
                "off by one in the exponent: with k drafts a pass yields up to k + 1 tokens, so the sum "
                "runs to alpha^k and the formula has alpha^(k + 1)"
            ),
            k + 1.0: "that is the best case, every draft accepted; weight each count by its probability",
            1 / (1 - alpha): "that is the limit for unbounded k; with k = 3 the sum stops at alpha^3",
        },
        rel=1e-4,
        what="1 + alpha + alpha^2 + alpha^3",
    )


# ---- 8.4 a Llama-3-70B's K/V per GPU under tensor parallelism

TP_MODEL = "Llama-3-70B"  # 80 layers, 64 query heads, 8 KV heads of head_dim 128; the cache in fp16
TP_SIZES = (4, 16)  # the --tensor-parallel-size values of exercise 8.4


def solve_8_4() -> dict[int, tuple[int, int]]:
    """8 KV heads over 4 GPUs: 2 each; over 16: each head on 2 GPUs, one head per GPU. K and V, 80 layers."""

    def per_gpu(heads: int) -> int:
        return 2 * 80 * heads * 128 * 2  # K and V x layers x heads x head_dim x 2 bytes

    return {4: (8 // 4, per_gpu(8 // 4)), 16: (1, per_gpu(1))}


def _tp_hint(tp: int, got, right_heads: int, right_bytes: int) -> str | None:
    """None if ``got`` is (``right_heads``, ``right_bytes``); else a hint for TP = ``tp``."""
    form = f"TP = {tp}: answer with a pair (KV heads per GPU, K/V bytes per token per GPU)"
    parts = _parts(got, 2)
    if parts is None:
        return form
    heads, num_bytes = as_number(parts[0]), parts[1]
    if heads is None:
        return f"TP = {tp}: KV heads per GPU is a number, not {type(parts[0]).__name__}"
    if heads != right_heads:
        spec = catalog_entry(TP_MODEL).spec
        if heads < 1:
            return (
                f"TP = {tp}: 8 KV heads cannot be cut {tp} ways; vLLM replicates each head on {tp} / 8 GPUs, "
                "so every GPU caches one whole head"
            )
        if heads == spec.num_kv_heads:
            return f"TP = {tp}: tensor parallelism splits the 8 KV heads over the {tp} GPUs"
        if heads == spec.num_heads // tp:
            return f"TP = {tp}: that splits the 64 query heads; the cache holds the 8 KV heads' K and V"
        return f"TP = {tp}: the 8 KV heads shared over {tp} GPUs (at least one whole head each)"
    hint = numeric_answer(
        num_bytes,
        right_bytes,
        {
            right_bytes / 2: (
                "half the answer: K only (each token caches a key AND a value per head and layer)"
                + ("" if right_heads == 1 else f", or one of the GPU's {right_heads} KV heads")
            ),
            right_bytes * 2: "fp16 takes 2 bytes per value, not 4",
            right_bytes * 8: "that is in bits; answer in bytes",
            right_bytes / 80: "that is one layer; the model has 80, each caching its own K and V",
            327_680: "that is the whole model's K/V per token; each GPU caches only its own heads",
        },
        rel=1e-9,
        what="2 (K, V) x 80 layers x heads per GPU x 128 x 2 bytes",
    )
    return f"TP = {tp}: {hint}" if hint else None


def check_8_4(answer):
    """Exercise 8.4: KV heads and K/V bytes per token on one GPU of a Llama-3-70B at TP = 4 and TP = 16.

    None if right, else a hint that names the likely mistake.
    """
    if not isinstance(answer, dict) or set(answer) != set(TP_SIZES):
        return "answer with a dict {4: (heads, bytes), 16: (heads, bytes)} keyed by the TP size"
    spec = catalog_entry(TP_MODEL).spec
    for tp in TP_SIZES:
        right = kv_heads_per_gpu(spec, tp), per_gpu_bytes(spec, 1, 1, "fp16", tp)
        hint = _tp_hint(tp, answer[tp], *right)
        if hint:
            return hint
    return None


# ---- 8.5 what disaggregated prefill sends

HANDOFF_PROMPT_LEN = 2048  # the prompt whose K/V the prefill GPU hands to the decode GPU
NETWORK = "400 Gb/s IB/RoCE"  # one 400 Gb/s link, per direction


def solve_8_5() -> tuple[int, float]:
    """2,048 tokens x 327,680 bytes; 400 Gb/s is 400e9 / 8 = 50e9 bytes per second."""
    kv_bytes = 2048 * (2 * 80 * 8 * 128 * 2)
    return kv_bytes, kv_bytes / (400e9 / 8)


def check_8_5(answer):
    """Exercise 8.5: the bytes a 2,048-token prompt of Llama-3-70B hands over, and their time at 400 Gb/s.

    None if right, else a hint that names the likely mistake.
    """
    form = "answer with a tuple (kv_bytes, transfer_s): the bytes handed over and the seconds they take"
    parts = _parts(answer, 2)
    if parts is None:
        return form
    handoff = pd_transfer(
        TP_MODEL, HANDOFF_PROMPT_LEN, NETWORK, tensor_parallel_size=1
    )  # the whole K/V, 1 link
    right_bytes, right_s = handoff.kv_bytes, handoff.transfer_s
    hint = numeric_answer(
        parts[0],
        right_bytes,
        {
            right_bytes / 2: "that is K only: the decode GPU needs every token's key AND value",
            right_bytes * 8: "that is in bits; answer in bytes",
            right_bytes / 80: "that is one layer; the prompt's K/V fills all 80",
            right_bytes / 8: "that is one KV head (one GPU's share at TP = 8); the model has 8 per layer",
            right_bytes / 4: "that is one GPU's share at TP = 4; the exercise hands over the whole K/V",
            right_bytes * 2: "fp16 takes 2 bytes per value, not 4",
        },
        rel=1e-9,
        what="2,048 tokens x 2 (K, V) x 80 layers x 8 heads x 128 x 2 bytes",
    )
    if hint:
        return f"kv_bytes: {hint}"
    bytes_per_s = LINKS[NETWORK].bytes_per_s
    hint = numeric_answer(
        parts[1],
        right_s,
        {
            right_bytes / (8 * bytes_per_s): (
                "400 Gb/s is gigaBITS per second: 400e9 / 8 = 50e9 bytes per second, not 400e9"
            ),
            right_bytes * 8 / bytes_per_s: (
                "you converted twice: that is the bits (bytes x 8) over the bytes per second (50e9); "
                "divide bits by bits per second, or bytes by bytes per second"
            ),
            right_bytes
            / (400 * 2**30 / 8): "network rates are decimal: 400 Gb/s is 400e9 bits, not 400 x 2^30",
            right_s * 1e3: "that is in milliseconds; answer in seconds",
            right_s
            / 4: "that is four GPUs each sending a quarter over its own link; here one link sends all",
        },
        rel=1e-4,
        what="kv_bytes / (400e9 / 8 bytes per second)",
    )
    return f"transfer_s: {hint}" if hint else None


# ---- realistic mistakes, which tests/test_exercises.py feeds to the checks

WRONG_ANSWERS = {
    "8.1": [
        (10.8, 0.05, False),  # TTFT as the first token's clock time
        (2.3, 0.05, False),  # TTFT to the last token
        (0.8, 1.5 / 31, False),  # TPOT over 31 tokens, not 30 gaps
        (0.8, 2.3 / 31, False),  # the paper's normalised latency
        (0.8, 2.3 / 30, False),  # TPOT from the arrival
        (800, 50, False),  # milliseconds
        (0.8, 0.05, True),  # TTFT met, TPOT not: the SLO is missed
        (0.8, 0.05, "no"),
        (0.8, 0.05),
        0.8,
    ],
    "8.2": [2, 1.953125, 1000 / 312, 3, 5, 1, "4"],
    "8.3": [2.4, 3.4, 1.952, 2.44, 4, 5, 0.8**3, "2.952"],
    "8.4": [
        {4: (2, 81_920), 16: (0.5, 20_480)},  # no replication: half a head per GPU
        {4: (2, 81_920), 16: (0, 0)},  # 8 // 16
        {4: (2, 81_920), 16: (1, 20_480)},  # K only
        {4: (2, 40_960), 16: (1, 20_480)},  # K only, both
        {4: (8, 327_680), 16: (8, 327_680)},  # no split at all
        {4: (16, 81_920), 16: (4, 40_960)},  # query heads split
        {4: (2, 163_840), 16: (1, 81_920)},  # fp32
        {4: (2, 1_024), 16: (1, 512)},  # one layer
        {4: (2, 655_360), 16: (1, 327_680)},  # bits
        {4: (2, 81_920)},
        (81_920, 40_960),
    ],
    "8.5": [
        (671_088_640, 671_088_640 / 400e9),  # Gb/s read as GB/s
        (671_088_640, 671_088_640 * 64 / 400e9),  # converted twice
        (671_088_640, 0.0134217728e3),  # milliseconds
        (671_088_640, 671_088_640 / 50e9 / 4),  # four links
        (671_088_640, 671_088_640 / (400 * 2**30 / 8)),  # binary gigabits
        (335_544_320, 335_544_320 / 50e9),  # K only
        (671_088_640 * 8, 671_088_640 / 50e9),  # bits
        (167_772_160, 167_772_160 / 50e9),  # one GPU's share at TP 4
        (8_388_608, 8_388_608 / 50e9),  # one layer
        671_088_640,
    ],
}

# What check("8.k", ...) says before the exercise is answered: a nudge, never the answer
FIRST_HINTS = {
    "8.1": (
        "TTFT is the wait from the request's arrival to its first token; TPOT is the mean gap between "
        "the output tokens after that. A request meets an SLO only if it meets every target"
    ),
    "8.2": (
        "each step the running decodes take their tokens of the budget first, and the prompt gets what is "
        "left: count how many such chunks the prompt needs, and remember that a step is whole"
    ),
    "8.3": (
        "a pass yields one token more than the drafts accepted before the first rejection, and a draft "
        "counts only if every draft before it was accepted too"
    ),
    "8.4": (
        "the cache holds K and V of the KV heads, not of the query heads: share those heads over the GPUs, "
        "and ask what happens when there are more GPUs than KV heads"
    ),
    "8.5": (
        "one token's K/V is 2 (K and V) x layers x KV heads x head_dim x bytes per value; then mind the "
        "link's unit: Gb/s counts bits"
    ),
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "8.1": (check_8_1, solve_8_1),
    "8.2": (check_8_2, solve_8_2),
    "8.3": (check_8_3, solve_8_3),
    "8.4": (check_8_4, solve_8_4),
    "8.5": (check_8_5, solve_8_5),
}
