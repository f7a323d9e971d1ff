"""Exercises of chapter 12 (an offload tier, and swapping priced as engines copy): the copy calls of a
swap, the load of a returning history over PCIe, the block size where per-block swapping stops paying,
and how many blocks a CPU tier holds.

Each ``check_12_k`` computes the expected answer with kvlib where kvlib has it
(:class:`kvlib.serving.swap.BlockCopyModel` for 12.1 and 12.2, :mod:`kvlib.sizing` for the bytes of a
token), never typed in, and recognises the usual mistakes by the answers they produce.
"""

from __future__ import annotations

import math

from kvlib.exercises.feedback import numeric_answer
from kvlib.serving.swap import BlockCopyModel
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import bytes_per_token


def _parts(answer, size: int) -> list | None:
    """``answer`` as a list of ``size`` parts if it is a tuple or list of that length, else None."""
    if not isinstance(answer, tuple | list) or len(answer) != size:
        return None
    return list(answer)


# ---- 12.1 the copy calls of one swap-out

SWAP_MODEL = "OPT-13B"  # 40 layers
SWAP_TOKENS = 1000  # the preempted request's tokens
SWAP_BLOCK_SIZE = 16


def solve_12_1() -> tuple[int, int]:
    """63 blocks (1,000 / 16, rounded up) x 40 layers x 2 (K, V); gathered: 40 layers x 2."""
    num_blocks = math.ceil(1000 / 16)
    return num_blocks * 40 * 2, 40 * 2


def _calls(per_block: bool) -> int:
    spec = catalog_entry(SWAP_MODEL).spec
    copies = BlockCopyModel(bytes_per_token(spec), spec.num_layers, SWAP_BLOCK_SIZE, 1.0, 0.0, per_block)
    return copies.num_calls(SWAP_TOKENS)


def check_12_1(answer):
    """Exercise 12.1: copy calls of one swap-out of 1,000 tokens of OPT-13B, per block and per layer.

    None if right, else a hint that names the likely mistake.
    """
    parts = _parts(answer, 2)
    if parts is None:
        return "answer with a tuple (per_block_calls, per_layer_calls): two whole numbers"
    per_block, per_layer = _calls(True), _calls(False)
    hint = numeric_answer(
        parts[0],
        per_block,
        {
            per_block / 2: "that is K only: each block of each layer is copied for K and again for V",
            1000 // 16 * 80: "a request of 1,000 tokens fills 62 blocks and part of a 63rd: round up",
            1000 / 16 * 80: "blocks are whole: round 1,000 / 16 up",
            per_block / 40: "that is one layer: each layer keeps its own blocks, copied by their own calls",
            math.ceil(1000 / 16): "that is the blocks; each is copied once per layer, for K and for V",
        },
        rel=1e-9,
        what="blocks (rounded up) x layers x 2",
    )
    if hint:
        return f"per_block_calls: {hint}"
    hint = numeric_answer(
        parts[1],
        per_layer,
        {
            per_layer / 2: "that is K only: one gathered call per layer for K, one for V",
            2: "a gathered call copies one layer's blocks: a layer's K/V is its own tensor",
            per_block: "that is the per-block count again; gathered, a call copies all of a layer's blocks",
        },
        rel=1e-9,
        what="layers x 2",
    )
    return f"per_layer_calls: {hint}" if hint else None


# ---- 12.2 a returning history loaded over PCIe

HISTORY_MODEL = "Llama-3-8B"  # 32 layers, 8 KV heads of head_dim 128, fp16
RETURN_HISTORY_TOKENS = 4096
LINK_BYTES_PER_S = 50e9  # PCIe 5.0 x16, as copies achieve it


def solve_12_2() -> float:
    """4,096 tokens x (2 x 32 x 8 x 128 x 2 = 131,072 bytes) over 50e9 bytes per second."""
    return 4096 * (2 * 32 * 8 * 128 * 2) / 50e9


def check_12_2(answer):
    """Exercise 12.2: seconds to copy a 4,096-token history of Llama-3-8B back at 50 GB/s (no call costs).

    None if right, else a hint that names the likely mistake.
    """
    spec = catalog_entry(HISTORY_MODEL).spec
    copies = BlockCopyModel(bytes_per_token(spec), spec.num_layers, 16, LINK_BYTES_PER_S, 0.0, False)
    right = copies.transfer_s(RETURN_HISTORY_TOKENS)
    return numeric_answer(
        answer,
        right,
        {
            right / 2: "that is K only: the prefill that follows needs every token's key AND value",
            right * 2: "fp16 takes 2 bytes per value, not 4",
            right * 4: "those are the 32 query heads; the cache holds the 8 KV heads",
            right * 8: "that counts bits; 50 GB/s are bytes",
            right / 32: "that is one layer; the history's K/V fills all 32",
            right * 1e3: "that is in milliseconds; answer in seconds",
            right * 1e9 / 2**30: "link rates are decimal: 50 GB/s is 50e9 bytes per second",
        },
        rel=1e-4,
        what="tokens x 2 (K, V) x layers x KV heads x head_dim x 2 bytes / (50e9 bytes per second)",
    )


# ---- 12.3 where per-block swapping stops paying

PREFILL_US = 80.0  # recomputation: microseconds per token
BYTES_US = 30.0  # one direction: one token's K/V bytes over the link, microseconds
CALL_US = 5.0  # one copy call
NUM_LAYERS = 40


def solve_12_3() -> float:
    """Out and back in, per token: 2 x (30 + 2 x 40 x 5 / B) = 80, so 800 / B = 20 and B = 40."""
    return 2 * 2 * 40 * 5.0 / (80.0 - 2 * 30.0)


def check_12_3(answer):
    """Exercise 12.3: the block size at which per-block swapping's cost per token equals recomputation's.

    None if right, else a hint that names the likely mistake.
    """
    calls = 2 * NUM_LAYERS * CALL_US  # one direction, one block: K and V of every layer
    right = 2 * calls / (PREFILL_US - 2 * BYTES_US)
    return numeric_answer(
        answer,
        right,
        {
            calls / (PREFILL_US - BYTES_US): "that prices one direction; a swap copies out and back in",
            calls / (PREFILL_US - 2 * BYTES_US): "that counts half the calls: each block of each layer takes "
            "a call for K and one for V, out and again back in",
            2
            * calls
            / PREFILL_US: "the calls are not the only cost: the bytes take their share of the 80 µs",
        },
        rel=1e-3,
        what="per token, out and back in: 2 x (bytes + 2 x layers x call / B) = prefill",
    )


# ---- 12.4 blocks in a CPU tier

TIER_GB = 10  # the CPU tier (LMCache's max_local_cpu_size, vLLM's --kv-offloading-size: set in GB/GiB)
TIER_BLOCK_SIZE = 16  # tokens per block, Llama-3-8B's fp16 cache


def solve_12_4() -> int:
    """A block is 16 x 131,072 = 2,097,152 bytes; 10 GB = 10e9 bytes hold 4,768 whole blocks."""
    return int(10e9 // (16 * 131_072))


def check_12_4(answer):
    """Exercise 12.4: whole 16-token blocks of Llama-3-8B that a 10 GB CPU tier holds.

    None if right, else a hint that names the likely mistake.
    """
    block = TIER_BLOCK_SIZE * bytes_per_token(catalog_entry(HISTORY_MODEL).spec)
    right = int(TIER_GB * 1e9 // block)
    return numeric_answer(
        answer,
        right,
        {
            TIER_GB * 2**30 // block: "that is 10 GiB (10 x 2^30 bytes); the tier here is 10 GB, 10e9 bytes",
            TIER_GB * 1e9 / block: "blocks are whole: round down",
            TIER_GB * 1e9 // (block / 2): "that counts K only: a block holds both K and V",
            TIER_GB * 1e9 // bytes_per_token(catalog_entry(HISTORY_MODEL).spec): "that counts tokens, not "
            "blocks of 16",
            math.ceil(TIER_GB * 1e9 / block): "a block that does not fit whole is not kept: round down",
        },
        rel=1e-9,
        what="10e9 bytes // (16 tokens x 131,072 bytes)",
    )


# ---- realistic mistakes, which tests/test_exercises.py feeds to the checks

WRONG_ANSWERS = {
    "12.1": [(2520, 40), (4960, 80), (5040, 2), (126, 2), (63, 1), (5040, 5040), 5040, (5040,)],
    "12.2": [0.0053687, 0.0214748, 0.0429497, 0.085899, 0.00033554, 10.737, 0.01, "0.0107"],
    "12.3": [8.0, 20.0, 10.0, 16.0, 80.0, "40"],
    "12.4": [5120, 10e9 / 2_097_152, 9536, 76293, 4769, None],
}

# What check("12.k", ...) says before the exercise is answered: a nudge, never the answer
FIRST_HINTS = {
    "12.1": (
        "vLLM's first swap issued one copy per block, per layer, for K and for V; a gathered copy moves all "
        "of a layer's blocks in one call. Count the blocks first"
    ),
    "12.2": (
        "one token's K/V is 2 (K and V) x layers x KV heads x head_dim x bytes per value; the history's "
        "bytes over the link's bytes per second give the seconds"
    ),
    "12.3": (
        "write each way's cost per token: recomputation's is given; a swap pays bytes and calls, out and "
        "back in, and a block's calls are shared by its B tokens"
    ),
    "12.4": "a block holds K and V of 16 tokens; GB are decimal, and only whole blocks are kept",
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "12.1": (check_12_1, solve_12_1),
    "12.2": (check_12_2, solve_12_2),
    "12.3": (check_12_3, solve_12_3),
    "12.4": (check_12_4, solve_12_4),
}
