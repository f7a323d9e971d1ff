"""Exercises of chapter 4: a KV budget, what a reservation (and its buddy block) wastes, a
half-empty reservation, batch size against throughput, the pow2 policy as code, and a
preemption policy run in the simulator.

Each ``check_4_k`` computes the expected answer with kvlib (never typed in) and recognises
the usual mistakes by the numbers they produce; 4.6's check runs the reader's policy in
:func:`kvlib.serving.simulator.simulate` and recognises the usual wrong rules by the requests
they pick. ``FIRST_HINTS``: what the chapter prints for an exercise not answered yet.
"""

from __future__ import annotations

# exercise 4.6 (a preemption policy the reader writes) lives in its own module, listed in EXERCISES below
from kvlib.chapters.ch04_serving.preemption_exercise import WRONG_ANSWERS_4_6, check_4_6, solve_4_6
from kvlib.exercises.feedback import (
    as_number,
    numeric_answer,
    returned_hint,
)  # a number checked against the mistakes it is known for
from kvlib.serving.allocators import BuddyAllocator
from kvlib.serving.placement import reservation_slots
from kvlib.serving.roofline import kv_budget, roofline_step_model
from kvlib.serving.traces import Request
from kvlib.units import GiB

CH4_MAX_LEN = 2048  # the server's max_len in exercises 4.2 and 4.5

FIRST_HINTS = {
    "4.1": (
        "Start from the bytes one token of Llama-2-7B takes in the cache (chapter 2), then see what "
        "the weights leave of the usable part of the GPU."
    ),
    "4.2": (
        "Two roundings stack here: pow2 rounds the output, then the buddy allocator rounds the "
        "whole reservation. Work out the block first."
    ),
    "4.3": (
        "Write down how many tokens the request holds at decode step k, then average that over the 400 steps."
    ),
    "4.4": (
        "Throughput is tokens per step divided by the step's time; a step takes the larger of its "
        "memory time and its compute time, and each depends on a different count."
    ),
    "4.5": (
        "Only the output is rounded: find the smallest power of two that is at least output_len, "
        "add the prompt, and never go above max_len."
    ),
    "4.6": (
        "A SeqState's tokens list holds its prompt and every token generated so far, so its length "
        "says how much K/V the request holds. Return one of the requests in running, not a position."
    ),
}

# ---- 4.1 the budget


def solve_4_1() -> int:
    """Llama-2-7B in fp16 on a 24 GiB GPU, 90% of it usable: (usable - weights) // bytes per block."""
    usable = int(0.9 * 24 * 2**30)
    weights = 6_738_415_616 * 2
    bytes_per_block = 2 * 32 * 32 * 128 * 2 * 16
    return (usable - weights) // bytes_per_block


def check_4_1(answer):
    """Exercise 4.1: the KV blocks Llama-2-7B leaves on a 24 GiB GPU (kvlib.serving.roofline).

    None if right, else a hint that names the likely mistake.
    """
    budget = kv_budget("Llama-2-7B", gpu_bytes=24 * GiB)
    block = budget.bytes_per_token * 16
    return numeric_answer(
        answer,
        budget.num_blocks,
        {
            (24 * GiB - budget.weight_bytes)
            // block: "the server uses only 90% of the GPU's memory (vLLM's gpu_memory_utilization)",
            (int(0.9 * 24e9) - budget.weight_bytes) // block: "24 GiB is 24 x 2^30 bytes, not 24 x 10^9",
            budget.kv_bytes
            // (block // 2): "a token stores a key AND a value in every layer: the factor 2 is missing",
            budget.num_blocks * 16: "that is in tokens; the question asks for blocks of 16 tokens",
            (int(0.9 * 24 * GiB) - budget.weight_bytes // 2)
            // block: "fp16 weights take 2 bytes per parameter",
        },
        rel=0,
        what="(0.9 x 24 GiB - 2 bytes x parameters) // (bytes per token x 16)",
    )


# ---- 4.2 what a pow2 reservation wastes


def solve_4_2() -> int:
    """pow2 asks for 300 + 512 = 812 slots; the buddy allocator gives a block of 1,024;
    600 of them hold tokens."""
    return 1024 - (300 + 300)


def check_4_2(answer):
    """Exercise 4.2: the slots of a pow2 reservation's buddy block that never hold a token.

    None if right, else a hint that names the likely mistake.
    """
    request = Request(0, 0.0, tuple(range(300)), 300)
    asked = reservation_slots("pow2", request, CH4_MAX_LEN)
    block = BuddyAllocator.footprint(asked)
    return numeric_answer(
        answer,
        block - request.total_len,
        {
            asked - request.total_len: (
                f"pow2 asks for {asked} slots, but the buddy allocator hands out a power of two: {block}"
            ),
            block: "that is the whole block; the question asks how many of its slots never hold a token",
            block - request.prompt_len: (
                "the output's 300 tokens will fill slots too: subtract the true total length"
            ),
            CH4_MAX_LEN - request.total_len: (
                "that is what max reserves in vain; pow2 rounds the OUTPUT up to a power of two"
            ),
            0: "the oracle's request has no slack, but even its block is rounded to a power of two",
        },
        rel=0,
        what="block of next_pow2(prompt + next_pow2(output)) slots, minus (prompt + output)",
    )


# ---- 4.3 a half-empty reservation


def solve_4_3() -> float:
    """At decode step k (1..400) the request holds 100 + k tokens of its 500 reserved slots."""
    return sum(100 + k for k in range(1, 401)) / 400 / 500


def check_4_3(answer):
    """Exercise 4.3: the average share of a reservation that holds tokens while the output grows.

    None if right, else a hint that names the likely mistake.
    """
    prompt, output = 100, 400
    expected = sum(prompt + k for k in range(1, output + 1)) / output / (prompt + output)
    return numeric_answer(
        answer,
        expected,
        {
            0.5: "the prompt's 100 tokens are there from the start: hold prompt + k tokens at step k",
            output
            / (
                prompt + output
            ): "that is the output's share of the reservation; average what is held over the steps",
            prompt / (prompt + output): "the request grows: at step k it holds prompt + k tokens",
            1 - expected: "that is the empty fraction; the question asks for the fraction holding tokens",
            100 * expected: "give a fraction between 0 and 1, not a percentage",
        },
        rel=0.01,
        what="the mean of (100 + k) / 500 over k = 1..400",
    )


# ---- 4.4 batch size and throughput


def solve_4_4() -> float:
    """Tokens per second = requests per step / step time; a step takes the larger of its memory
    time (the weights and the cache it reads) and its compute time (its sequences' tokens)."""
    paged = 30 / max(16.5e-3 + 0.53e-6 * 15_000, 82e-6 * 30)
    oracle = 15 / max(16.5e-3 + 0.53e-6 * 7_500, 82e-6 * 15)
    return paged / oracle


def check_4_4(answer):
    """Exercise 4.4: paged's throughput (batch 30) over the oracle's (batch 15) by the roofline step model.

    None if right, else a hint that names the likely mistake.
    """
    step = roofline_step_model("OPT-13B")
    # 16.5 ms, 82 µs and 0.53 µs, as the exercise states them
    fixed, per_seq, per_token = round(step.fixed_s, 4), round(step.per_seq_s, 6), round(step.per_context_s, 8)

    def rate(batch, context, combine=max, token=per_token):
        """Tokens per second of ``batch`` requests that read ``context`` cached tokens per step."""
        return batch / combine(fixed + token * context, per_seq * batch)

    def added(memory, compute):
        return memory + compute

    expected = rate(30, 15_000) / rate(15, 7_500)
    return numeric_answer(
        answer,
        expected,
        {
            2.0: (
                "twice the batch also reads twice the cache: each step's memory time is the weights' "
                "16.5 ms plus 0.53 µs per cached token"
            ),
            1 / expected: "that is the oracle over paging; the question asks for paging over the oracle",
            rate(30, 15_000, added) / rate(15, 7_500, added): (
                "a GPU overlaps reading memory with computing: a step takes the larger of its memory "
                "time and its compute time, not their sum"
            ),
            # the compute time alone gives 1.0, and so does 0.53 µs taken as 0.53e-3 s (1.002)
            1.0: (
                "a step takes the LARGER of its two times: here the memory time, far above the compute "
                "time (and if your arithmetic gave about 1.00 with the memory time: 0.53 µs is 0.53e-6 s, "
                "not 0.53e-3)"
            ),
            expected / 2: (  # the inverse ratio of the step times
                "each step generates one token per running request: divide the batch by the step's time"
            ),
        },
        rel=0.01,
        what=(
            "(30 / t_paged) / (15 / t_oracle) with t = max(16.5 ms + 0.53 µs x cached tokens, "
            "82 µs x sequences)"
        ),
    )


# ---- 4.5 the pow2 policy as code


def solve_4_5():
    """The prompt plus the output rounded up to a power of two, capped at max_len."""

    def pow2_slots(prompt_len: int, output_len: int, max_len: int) -> int:
        return min(max_len, prompt_len + (1 << (output_len - 1).bit_length()))

    return pow2_slots


def check_4_5(answer):
    """Exercise 4.5: a reader's pow2_slots function, against kvlib.serving.placement's pow2 policy.

    None if right, else a hint that names the likely mistake.
    """
    if not callable(answer):
        return "answer with a function pow2_slots(prompt_len, output_len, max_len) -> slots"
    cases = [
        (40, 25, CH4_MAX_LEN),
        (10, 16, CH4_MAX_LEN),
        (1, 1, CH4_MAX_LEN),
        (10, 17, CH4_MAX_LEN),
        (161, 338, CH4_MAX_LEN),
        (500, 512, CH4_MAX_LEN),
        (7, 1000, CH4_MAX_LEN),
        (1500, 540, CH4_MAX_LEN),
        (300, 300, 700),
        (3, 5, 10),
    ]
    for prompt, output, max_len in cases:
        expected = reservation_slots("pow2", Request(0, 0.0, (0,) * prompt, output), max_len)
        try:
            got = answer(prompt, output, max_len)
        except Exception as error:  # the reader's code: report, do not crash
            return f"your function raised {type(error).__name__}: {error}"
        if returned_hint(got, "a number of slots"):
            return returned_hint(got, "a number of slots")
        got = as_number(got)
        if got == expected:
            continue
        if got == min(max_len, 1 << (prompt + output - 1).bit_length()):
            return (
                "round the OUTPUT length up to a power of two and add the prompt; the paper's pow2 does "
                "not round the prompt"
            )
        if got == min(max_len, prompt + output):
            return (
                "that is the oracle's reservation (the true length); pow2 rounds the output up to a "
                "power of two"
            )
        if output & (output - 1) == 0 and got == min(max_len, prompt + 2 * output):
            return (
                f"an output of {output} tokens is already a power of two: reserve {output} for it, not "
                "twice as much"
            )
        if got > max_len:
            return (
                f"for prompt {prompt}, output {output} you reserve {got}, more than max_len = "
                f"{max_len}: cap it"
            )
        if got < prompt + output:
            return (
                f"for prompt {prompt}, output {output} you reserve only {got}: the reservation must "
                "hold the whole request"
            )
        return f"for prompt {prompt}, output {output}, max_len {max_len}: expected {expected}, got {got}"
    return None


WRONG_ANSWERS = {
    "4.1": [1465, 968, 2317, 18528, 1158 * 2],
    "4.2": [212, 1024, 724, 1448, 0],
    "4.3": [0.5, 0.8, 0.2, 0.399, 60.1],
    "4.4": [2.0, 0.6, 1.613, 0.837, 1.0, 1.3],
    "4.5": [
        lambda p, o, m: min(m, 1 << (p + o - 1).bit_length()),
        lambda p, o, m: min(m, p + (1 << o.bit_length())),
        lambda p, o, m: p + (1 << (o - 1).bit_length()),
        lambda p, o, m: min(m, p + o),
        "pow2",
    ],
    "4.6": WRONG_ANSWERS_4_6,
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "4.1": (check_4_1, solve_4_1),
    "4.2": (check_4_2, solve_4_2),
    "4.3": (check_4_3, solve_4_3),
    "4.4": (check_4_4, solve_4_4),
    "4.5": (check_4_5, solve_4_5),
    "4.6": (check_4_6, solve_4_6),
}
