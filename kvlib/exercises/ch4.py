"""Exercises of chapter 4: a KV budget, what a reservation wastes, a half-empty reservation,
batch size against throughput, and the pow2 policy as code.

Each ``check_4_k`` computes the expected answer with kvlib (never typed in) and recognises
the usual mistakes by the numbers they produce.
"""

from __future__ import annotations

from kvlib.exercises.ch2 import _numeric  # the same tolerant comparison as chapter 2
from kvlib.placement import reservation_slots
from kvlib.serving_measure import kv_budget, roofline_step_model
from kvlib.sizing import GiB
from kvlib.traces import Request

MAX_LEN = 2048

# ---- 4.1 the budget


def solve_4_1() -> int:
    """Llama-2-7B in fp16 on a 24 GiB GPU, 90% of it usable: (usable - weights) // bytes per block."""
    usable = int(0.9 * 24 * 2**30)
    weights = 6_738_415_616 * 2
    bytes_per_block = 2 * 32 * 32 * 128 * 2 * 16
    return (usable - weights) // bytes_per_block


def check_4_1(answer):
    budget = kv_budget("Llama-2-7B", gpu_bytes=24 * GiB)
    block = budget.bytes_per_token * 16
    return _numeric(answer, budget.num_blocks, {
        (24 * GiB - budget.weight_bytes) // block: "the server uses only 90% of the GPU's memory (vLLM's gpu_memory_utilization)",
        (int(0.9 * 24e9) - budget.weight_bytes) // block: "24 GiB is 24 x 2^30 bytes, not 24 x 10^9",
        budget.kv_bytes // (block // 2): "a token stores a key AND a value in every layer: the factor 2 is missing",
        budget.num_blocks * 16: "that is in tokens; the question asks for blocks of 16 tokens",
        (int(0.9 * 24 * GiB) - budget.weight_bytes // 2) // block: "fp16 weights take 2 bytes per parameter",
    }, rel=0, what="(0.9 x 24 GiB - 2 bytes x parameters) // (bytes per token x 16)")


# ---- 4.2 what a pow2 reservation wastes


def solve_4_2() -> int:
    """True total 600 tokens; pow2 reserves 1,024; 424 slots stay empty."""
    return 1024 - (300 + 300)


def check_4_2(answer):
    request = Request(0, 0.0, tuple(range(300)), 300)
    reserved = reservation_slots("pow2", request, MAX_LEN)
    return _numeric(answer, reserved - request.total_len, {
        reserved: "that is the whole reservation; the question asks how many of its slots never hold a token",
        reserved - request.prompt_len: "the output's 300 tokens will fill slots too: subtract the true total length",
        MAX_LEN - request.total_len: "that is what max reserves in vain; pow2 reserves the next power of two of 600",
        0: "the oracle wastes nothing beyond the true length; pow2 rounds up to a power of two",
        512 - request.total_len: "512 is smaller than 600: round UP to the next power of two",
    }, rel=0, what="next power of two of (prompt + output), minus (prompt + output)")


# ---- 4.3 a half-empty reservation


def solve_4_3() -> float:
    """At decode step k (1..400) the request holds 100 + k tokens of its 500 reserved slots."""
    return sum(100 + k for k in range(1, 401)) / 400 / 500


def check_4_3(answer):
    prompt, output = 100, 400
    expected = sum(prompt + k for k in range(1, output + 1)) / output / (prompt + output)
    return _numeric(answer, expected, {
        0.5: "the prompt's 100 tokens are there from the start: hold prompt + k tokens at step k",
        output / (prompt + output): "that is the output's share of the reservation; average what is held over the steps",
        prompt / (prompt + output): "the request grows: at step k it holds prompt + k tokens",
        1 - expected: "that is the empty fraction; the question asks for the fraction holding tokens",
        100 * expected: "give a fraction between 0 and 1, not a percentage",
    }, rel=0.01, what="the mean of (100 + k) / 500 over k = 1..400")


# ---- 4.4 batch size and throughput


def solve_4_4() -> float:
    """Tokens per second = requests per step / step time; the step grows with the cache it reads."""
    paged = 30 / (16.5e-3 + 0.53e-6 * 15_000)
    oracle = 15 / (16.5e-3 + 0.53e-6 * 7_500)
    return paged / oracle


def check_4_4(answer):
    step = roofline_step_model("OPT-13B")
    fixed, per_token = round(step.fixed_s, 4), round(step.per_context_s, 8)  # 16.5 ms and 0.53 µs, as stated
    rate = lambda batch, context: batch / (fixed + per_token * context)  # noqa: E731
    expected = rate(30, 15_000) / rate(15, 7_500)
    return _numeric(answer, expected, {
        2.0: "twice the batch reads twice the cache: add 0.53 µs per cached token to each step",
        1 / expected: "that is the oracle over paging; the question asks for paging over the oracle",
        30 / (fixed + 1e-3 * 0.53 * 15_000) / (15 / (fixed + 1e-3 * 0.53 * 7_500)): "0.53 µs is 0.53e-6 s, not 0.53e-3",
        1.0: "each step generates one token per running request: more requests per step means more tokens",
    }, rel=0.01, what="(30 / t_paged) / (15 / t_oracle) with t = 16.5 ms + 0.53 µs x cached tokens")


# ---- 4.5 the pow2 policy as code


def solve_4_5():
    """The smallest power of two >= total_len, capped at max_len."""

    def pow2_slots(total_len: int, max_len: int) -> int:
        return min(max_len, 1 << (total_len - 1).bit_length())

    return pow2_slots


def check_4_5(answer):
    if not callable(answer):
        return "answer with a function pow2_slots(total_len, max_len) -> slots"
    cases = [(n, MAX_LEN) for n in (2, 3, 15, 16, 17, 499, 512, 513, 1024, 1500, 2047, 2048)] + [(600, 1000), (513, 768)]
    for total, max_len in cases:
        expected = reservation_slots("pow2", Request(0, 0.0, (0,) * (total - 1), 1), max_len)
        try:
            got = answer(total, max_len)
        except Exception as error:  # the reader's code: report, do not crash
            return f"your function raised {type(error).__name__}: {error}"
        if got == expected:
            continue
        if got == 2 * total and total & (total - 1) == 0:
            return f"for {total}, an exact power of two, reserve {total} itself, not twice as much"
        if got > max_len:
            return f"for {total} you reserve {got}, more than max_len = {max_len}: cap it"
        if got < total:
            return f"for {total} you reserve only {got}: the reservation must hold the whole request"
        return f"for total_len {total}, max_len {max_len}: expected {expected}, got {got}"
    return None


WRONG_ANSWERS = {
    "4.1": [1465, 968, 2317, 18528, 1158 * 2],
    "4.2": [1024, 724, 1448, 0, -88],
    "4.3": [0.5, 0.8, 0.2, 0.399, 60.1],
    "4.4": [2.0, 0.597, 1.0, 1.3],
    "4.5": [
        lambda n, m: min(m, 1 << n.bit_length()),
        lambda n, m: 1 << (n - 1).bit_length(),
        lambda n, m: min(m, 1 << (n.bit_length() - 1)),
        lambda n, m: min(m, n),
        "pow2",
    ],
}
