"""Exercises of chapter 5: multiplying the levers' factors, a hybrid's fixed state against its
cache, why a doubled batch is not doubled throughput, what a shared system prompt saves, and
the KV budget of any variant as code.

Each ``check_5_k`` computes the expected answer with kvlib (never typed in) and recognises
the usual mistakes by the numbers they produce; ``FIRST_HINTS`` holds the nudge that
:func:`kvlib.exercises.check` gives while an exercise is still the blank ``answer = ...``.
"""

from __future__ import annotations

from kvlib import gpus
from kvlib.chapters.ch05_levers import levers
from kvlib.exercises.feedback import (
    as_number,
    numeric_answer,
    returned_hint,
)  # a number checked against the mistakes it is known for
from kvlib.units import GiB

# ---- 5.1 the factors multiply


def solve_5_1() -> int:
    """524,288 bytes x 8/32 KV heads x 9/16 (int8 + scales) x 4/32 attention layers."""
    mha_fp16 = 2 * 32 * 32 * 128 * 2
    int8_factor = (128 + (128 // 32) * 4) / (128 * 2)  # 1 byte per number + 4 bytes per 32 numbers, over fp16
    return round(mha_fp16 * 8 / 32 * int8_factor * 4 / 32)


def check_5_1(answer):
    """Exercise 5.1: bytes per token after three levers, the product of their factors
    (kvlib.chapters.ch05_levers.levers).

    None if right, else a hint that names the likely mistake.
    """
    chain = levers.lever_chain("Llama-2-7B", levers=levers.LEVERS[:3], dtype="int8")
    expected = chain[-1].bytes_per_token
    return numeric_answer(
        answer,
        expected,
        {
            expected * 16 / 18: (
                "an int8 cache also stores one fp16 scale and one fp16 zero point per 32 numbers: 1.125 "
                "bytes per number, not 1"
            ),
            expected * 16 / 9: "you kept 2 bytes per number; the int8 cache takes 1 byte plus its scales",
            expected * 8: "the hybrid keeps attention in 4 of the 32 layers: divide by 8 as well",
            expected * 4: "GQA-8 keeps 8 of the 32 KV heads: divide by 4 as well",
            expected
            * 17
            / 18: "the scales are an fp16 scale AND an fp16 zero point per 32 numbers (4 bytes per group)",
            expected / 2: "a token stores a key AND a value per KV head and layer",
        },
        rel=0,
        what="524,288 x 1/4 x 9/16 x 1/8",
    )


# ---- 5.2 a hybrid's fixed state against its cache


def solve_5_2() -> int:
    """28 Mamba layers x 8,192 channels x (4 + 16) numbers x 2 bytes, over 8,192 KV bytes per token."""
    state = 28 * (2 * 4096) * (4 + 16) * 2
    return state // (2 * 4 * 8 * 128 * 1)


def check_5_2(answer):
    """Exercise 5.2: how many tokens of cache the hybrid's fixed Mamba state is worth.

    None if right, else a hint that names the likely mistake.
    """
    hybrid = levers.lever_chain("Llama-2-7B")[3]
    expected = hybrid.state_bytes / hybrid.bytes_per_token
    return numeric_answer(
        answer,
        expected,
        {
            expected
            * 32
            / 28: "only the 28 layers without attention are Mamba layers; the other 4 keep the KV cache",
            expected
            / 2: "half the answer: the variant's cache is fp8 (8,192 bytes per token, not fp16's 16,384), "
            "and Mamba "
            "has expand x hidden = 2 x 4,096 = 8,192 channels per layer",
            expected
            * 16
            / 20: "each channel keeps its 16 SSM numbers AND the last 4 inputs of its convolution",
            expected * 4 / 20: "each channel keeps its 4 convolution inputs AND 16 SSM numbers",
        },
        rel=1e-3,
        what="state bytes (28 x 8,192 x 20 x 2) / KV bytes per token (8,192)",
    )


# ---- 5.3 a doubled batch is not doubled throughput


def solve_5_3() -> float:
    """Tokens/s = batch / max(weights read, compute per sequence x batch), at 256 over 128: a GPU
    reads the weights while it computes, so a step takes the longer of the two."""
    fixed = 2 * 6_738_415_616 / 1.555e12  # s: read the fp16 weights once per step
    per_seq = 2 * 6_738_415_616 / 312e12  # s: 2 x parameters FLOPs per token at peak
    return (256 / max(fixed, 256 * per_seq)) / (128 / max(fixed, 128 * per_seq))


def check_5_3(answer):
    """Exercise 5.3: the throughput gain of 256 over 128 running sequences on the baseline's step model
    (the roofline: the larger of the weights' reading and the arithmetic, cache and prefill left out).

    None if right, else a hint that names the likely mistake.
    """
    step = levers.variant_step_model(levers.base_variant("Llama-2-7B"))

    def rate(batch, overlapped=True):
        """Tokens per second of ``batch`` running sequences by the book's step model (no cache, no
        prefill), or with the weights' reading and the arithmetic summed (not overlapped)."""
        if overlapped:
            return batch / float(step.predict(batch, 0, 0))
        return batch / (step.fixed_s + step.per_seq_s * batch)

    expected = rate(256) / rate(128)
    return numeric_answer(
        answer,
        expected,
        {
            2.0: (
                "each sequence's token also costs 2 x parameters FLOPs: at 256 sequences the arithmetic "
                "takes longer than reading the weights, so the step is longer than at 128"
            ),
            1 / expected: "that is batch 128 over batch 256; the question asks 256 over 128",
            1.0: (
                "at 128 sequences the arithmetic is shorter than the reading of the weights and hides "
                "under it: the step takes the longer of the two, not the arithmetic alone"
            ),
            rate(256, False) / rate(128, False): (
                "a GPU reads memory while it computes: a step takes the longer of the two times, not "
                "their sum"
            ),
        },
        rel=0.005,
        what="(256 / t(256)) / (128 / t(128)) with t(b) = max(8.67 ms, b x 43.2 µs)",
    )


# ---- 5.4 what a shared system prompt saves


def solve_5_4() -> float:
    """247 of 248 copies of 256 tokens x 8,192 bytes are not stored, in MiB."""
    return (248 - 1) * 256 * 8192 / 2**20


def check_5_4(answer):
    """Exercise 5.4: the MiB a shared 256-token system prompt saves across 248 requests.

    None if right, else a hint that names the likely mistake.
    """
    per_token = levers.lever_chain("Llama-2-7B")[5].bytes_per_token
    expected = (248 - 1) * 256 * per_token / 2**20
    return numeric_answer(
        answer,
        expected,
        {
            248
            * 256
            * per_token
            / 2**20: "one copy of the system prompt is still stored: 247 copies are saved, not 248",
            expected * 2**20: "that is in bytes; answer in MiB (2^20 bytes)",
            expected * 2**20 / 1e6: "that is in MB of 10^6 bytes; answer in MiB (2^20 bytes)",
            expected * 2: "the variant's cache is fp8: 8,192 bytes per token",
            (248 - 1) * 256: "that counts tokens; multiply by 8,192 bytes per token",
        },
        rel=1e-3,
        what="(248 - 1) x 256 tokens x 8,192 bytes / 2^20",
    )


# ---- 5.5 the KV budget of any variant, as code


def solve_5_5():
    """Usable memory minus weights minus the states of every sequence that may run, in whole blocks."""

    def kv_slots(
        gpu_bytes: int,
        num_parameters: int,
        bytes_per_token: int,
        state_bytes: int = 0,
        max_num_seqs: int = 256,
        memory_fraction: float = 0.9,
        block_size: int = 16,
    ) -> int:
        free = int(gpu_bytes * memory_fraction) - 2 * num_parameters - max_num_seqs * state_bytes
        return free // (bytes_per_token * block_size) * block_size

    return kv_slots


def check_5_5(answer):
    """Exercise 5.5: a reader's kv_slots function, against
    kvlib.chapters.ch05_levers.levers.variant_kv_budget.

    None if right, else a hint that names the likely mistake.
    """
    if not callable(answer):
        return (
            "answer with a function kv_slots(gpu_bytes, num_parameters, bytes_per_token, state_bytes) "
            "-> token slots"
        )
    devices = (gpus.A100_40GB, gpus.GPU("80 GiB GPU", 80 * GiB, 2e12, 5e14))
    variants = levers.lever_chain("Llama-2-7B") + levers.alone_variants("Llama-2-7B")
    for gpu in devices:
        for v in variants:
            budget = levers.variant_kv_budget(v, gpu)
            try:
                got = answer(gpu.memory_bytes, v.num_parameters, v.bytes_per_token, v.state_bytes)
            except Exception as error:  # the reader's code: report, do not crash
                return f"your function raised {type(error).__name__}: {error}"
            if returned_hint(got, "a number of token slots"):
                return returned_hint(got, "a number of token slots")
            got = as_number(got)
            if got == budget.num_slots:
                continue
            label = f"{v.name} on the {gpu.name}"
            if got == budget.kv_bytes // v.bytes_per_token:
                return (
                    f"{label}: a paged cache is handed out in whole blocks of 16; round the slots down "
                    "to a multiple of 16"
                )
            if got == budget.num_blocks:
                return f"{label}: that is in blocks; return token slots (blocks x 16)"
            if (
                v.state_bytes
                and got == (budget.kv_bytes + 256 * v.state_bytes) // (16 * v.bytes_per_token) * 16
            ):
                return (
                    f"{label}: set aside the Mamba state of every sequence that may run (256), before "
                    "the cache"
                )
            if got > budget.num_slots:
                return f"{label}: {got:,} is too many; a server uses only 90% of the GPU's memory"
            if got < budget.num_slots:
                return (
                    f"{label}: {got:,} is too few; fp16 weights take 2 bytes per parameter, and only "
                    "256 states are set aside"
                )
            return f"{label}: expected {budget.num_slots:,} token slots, got {got:,}"
    return None


FIRST_HINTS = {
    "5.1": (
        "Each lever multiplies the bytes of a token by its own factor. Write the three factors down one "
        "by one (KV heads kept, bytes per stored number, attention layers kept) before multiplying; "
        "what does an int8 number really take once its group's scales are counted?"
    ),
    "5.2": (
        "The state does not grow with the context; the cache does. Work out the state's bytes for one "
        "sequence first, then ask how many tokens of cache weigh as much."
    ),
    "5.3": (
        "Split a decode step into a part paid once per step (reading the weights) and a part paid per "
        "running sequence (its arithmetic); a GPU does both at once, so the step lasts as long as the "
        "longer. The tokens per second of a batch are the batch divided by the step's time."
    ),
    "5.4": (
        "Prefix caching does not make the system prompt free: how many copies of it are still stored, "
        "and how many are not?"
    ),
    "5.5": (
        "The exercise's sentence is the recipe: turn each of its clauses (the share of the memory, the "
        "weights, the states, the blocks) into one line of code, in that order."
    ),
}


WRONG_ANSWERS = {
    "5.1": [8192, 16384, 73728, 36864, 8704, 4608, "9216"],
    "5.2": [1280, 560, 896, 224, 1000],
    "5.3": [2.0, 0.638, 1.0, 1.44, 1.2],
    "5.4": [496.0, 517_996_544, 518.0, 988.0, 63_232],
    "5.5": [
        lambda g, p, b, s=0: (int(0.9 * g) - 2 * p - 256 * s) // b,
        lambda g, p, b, s=0: (int(0.9 * g) - 2 * p - 256 * s) // (16 * b),
        lambda g, p, b, s=0: (int(0.9 * g) - 2 * p) // (16 * b) * 16,
        lambda g, p, b, s=0: (g - 2 * p - 256 * s) // (16 * b) * 16,
        lambda g, p, b, s=0: (int(0.9 * g) - 4 * p - 256 * s) // (16 * b) * 16,
        "kv_slots",
    ],
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "5.1": (check_5_1, solve_5_1),
    "5.2": (check_5_2, solve_5_2),
    "5.3": (check_5_3, solve_5_3),
    "5.4": (check_5_4, solve_5_4),
    "5.5": (check_5_5, solve_5_5),
}
