"""Exercises of chapter 3: blocks per request, the memory paging and reservation waste,
fork and copy-on-write, prefix caching, and the slot mapping.

Each ``check_3_k`` computes the expected answer with :mod:`kvlib.paged` (never typed in)
and recognises the usual mistakes by the numbers they produce.
"""

from __future__ import annotations

from kvlib.exercises.feedback import numeric_answer  # a number checked against the mistakes it is known for
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.usage import block_usage
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import bytes_per_token
from kvlib.units import MiB, ceil_div

LENGTHS = (1000, 37, 16, 1)  # the four requests of exercises 3.1-3.3
BLOCK_SIZE = 16
CH3_MAX_LEN = 2048  # tokens a contiguous reservation holds (exercise 3.3)


def _blocks_used(lengths, block_size: int = BLOCK_SIZE) -> int:
    manager = BlockManager(num_blocks=sum(lengths), block_size=block_size, enable_prefix_caching=False)
    for seq_id, n in enumerate(lengths):
        manager.allocate(seq_id, [0] * n)
    return block_usage(manager).num_used_blocks


# ---- 3.1 blocks per request


def solve_3_1() -> int:
    """Each request rounds up to whole blocks on its own: ceil(n / 16) per request."""
    return sum(ceil_div(n, BLOCK_SIZE) for n in LENGTHS)


def check_3_1(answer):
    """Exercise 3.1: the blocks the four requests take, counted by the block manager.

    None if right, else a hint that names the likely mistake.
    """
    expected = _blocks_used(LENGTHS)
    total = sum(LENGTHS)
    return numeric_answer(
        answer,
        expected,
        {
            sum(
                n // BLOCK_SIZE for n in LENGTHS
            ): "you rounded down: a partly filled last block is still a whole block",
            ceil_div(
                total, BLOCK_SIZE
            ): "blocks belong to one sequence each: round up per request, not the total",
            total / BLOCK_SIZE: "blocks are whole: round up per request",
        },
        rel=0,
        what="ceil(length / block_size) for each request",
    )


# ---- 3.2 what paging wastes, in MiB


def solve_3_2() -> float:
    """Empty slots in last blocks x bytes per token of OPT-13B (40 layers, 5,120 wide, fp16)."""
    empty_slots = 68 * 16 - (1000 + 37 + 16 + 1)
    return empty_slots * 2 * 40 * 5120 * 2 / 2**20


def check_3_2(answer):
    """Exercise 3.2: what the last blocks' empty slots waste for OPT-13B, in MiB.

    None if right, else a hint that names the likely mistake.
    """
    per_token = bytes_per_token(catalog_entry("OPT-13B").spec)
    empty = _blocks_used(LENGTHS) * BLOCK_SIZE - sum(LENGTHS)
    expected = empty * per_token / MiB
    return numeric_answer(
        answer,
        expected,
        {
            float(
                empty
            ): "that is the number of empty slots; multiply by the bytes one token takes in OPT-13B's cache",
            expected / 2: "a token stores a key AND a value in every layer: the factor 2 is missing",
            expected * 2: "fp16 takes 2 bytes per value, not 4",
            expected * MiB / 1e6: "that is in MB of 10^6 bytes; answer in MiB (2^20 bytes)",
            len(LENGTHS)
            * (BLOCK_SIZE - 1)
            / 2
            * per_token
            / MiB: "that is the expected waste (half a block per request); count the real empty slots",
        },
        rel=1e-3,
        what="(blocks x 16 - tokens) x bytes per token",
    )


# ---- 3.3 what reserving the maximum length wastes


def solve_3_3() -> float:
    """Reserving 2,048 slots per request: the fraction of reserved slots that stays empty."""
    return 1 - sum(LENGTHS) / (len(LENGTHS) * CH3_MAX_LEN)


def check_3_3(answer):
    """Exercise 3.3: the empty share of slots when every request reserves the maximum length.

    None if right, else a hint that names the likely mistake.
    """
    used, reserved = sum(LENGTHS), len(LENGTHS) * CH3_MAX_LEN
    expected = 1 - used / reserved
    return numeric_answer(
        answer,
        expected,
        {
            used / reserved: "that is the fraction holding tokens; the question asks for the empty fraction",
            100 * expected: "give a fraction between 0 and 1, not a percentage",
            1
            - used
            / (
                len(LENGTHS) * max(LENGTHS)
            ): "every request reserves the model's maximum length (2,048), not the longest request",
        },
        rel=1e-3,
        what="1 - tokens / (requests x 2,048)",
    )


# ---- 3.4 fork and copy-on-write


def solve_3_4() -> int:
    """37 tokens = 3 blocks (the last holds 5). Four branches share them; the first three to
    append copy the shared last block, the fourth is then its only user and writes in place."""
    return 3 + 3


def check_3_4(answer):
    """Exercise 3.4: blocks in use once four forked branches have each appended a token (copy-on-write).

    None if right, else a hint that names the likely mistake.
    """
    manager = BlockManager(num_blocks=32, block_size=BLOCK_SIZE)
    tokens = [list(range(37))]  # each branch's token list, which the caller owns
    manager.allocate(0, tokens[0])
    manager.mark_computed(0)
    tokens += [manager.fork(0, child) for child in (1, 2, 3)]
    for seq in range(4):
        tokens[seq].append(0)
        manager.append_slot(seq)
    expected = block_usage(manager).num_used_blocks
    return numeric_answer(
        answer,
        expected,
        {
            12: (
                "the branches share the prompt's blocks (fork only increments ref_cnt); only the shared "
                "last block is copied"
            ),
            7: (
                "the last branch to append is the block's only user by then (ref_cnt 1): it writes in "
                "place, no copy"
            ),
            3: (
                "a branch never writes into a block others still use: the first write to the shared last "
                "block copies it"
            ),
            4: "every branch but the last needs its own copy of the partly filled last block",
            9: (
                "full blocks are never written again, so they stay shared; only the partly filled last "
                "block is copied"
            ),
        },
        rel=0,
        what="shared blocks + copies",
    )


# ---- 3.5 prefix caching


def solve_3_5() -> int:
    """Only full blocks are hashed and cached: 100 // 16 = 6 blocks of the system prompt."""
    return 100 // 16 * 16


def check_3_5(answer):
    """Exercise 3.5: the prompt tokens a second request with the same system prompt finds cached.

    None if right, else a hint that names the likely mistake.
    """
    system, user = list(range(100)), list(range(1000, 1020))
    manager = BlockManager(num_blocks=32, block_size=BLOCK_SIZE)
    manager.allocate(0, system + user)
    manager.mark_computed(0)
    expected = manager.allocate(1, system + list(range(2000, 2020))).num_cached_tokens
    return numeric_answer(
        answer,
        expected,
        {
            100: (
                "only FULL blocks are cached, and the 7th block mixes system-prompt and user tokens, so "
                "it differs"
            ),
            112: "round down: the 7th block is not identical in the two requests",
            6: "that is the number of blocks; the question asks for tokens",
        },
        rel=0,
        what="whole blocks inside the shared prefix",
    )


# ---- 3.6 the slot mapping


def solve_3_6():
    """Token p lives in logical block p // block_size, at offset p % block_size."""

    def slot_mapping(block_table: list[int], num_tokens: int, block_size: int) -> list[int]:
        return [block_table[p // block_size] * block_size + p % block_size for p in range(num_tokens)]

    return slot_mapping


def check_3_6(answer):
    """Exercise 3.6: a reader's slot_mapping function, against the block manager's tables.

    None if right, else a hint that names the likely mistake.
    """
    if not callable(answer):
        return "answer with a function slot_mapping(block_table, num_tokens, block_size) -> list of slots"
    for block_size, lengths in ((4, (6, 3, 9)), (16, (40, 17)), (1, (5, 2))):
        manager = BlockManager(num_blocks=64, block_size=block_size, enable_prefix_caching=False)
        for filler in range(64):  # scramble the free queue, so that block tables are not contiguous
            manager.allocate(100 + filler, [0])
        for filler in range(64):
            manager.free(100 + filler * 37 % 64)
        for seq_id, n in enumerate(lengths):
            manager.allocate(seq_id, [0] * n)
        for seq_id, n in enumerate(lengths):
            expected = [manager.slot(seq_id, p) for p in range(n)]
            try:
                returned = answer(manager.block_table(seq_id), n, block_size)
            except Exception as error:  # the reader's code: report, do not crash
                return f"your function raised {type(error).__name__}: {error}"
            if isinstance(returned, str | bytes | dict) or not hasattr(returned, "__iter__"):
                return (
                    f"your function returned {returned!r}"[:80]
                    + f" ({type(returned).__name__}), not a list of slots"
                )
            got = list(returned)
            if got == expected:
                continue
            table = manager.block_table(seq_id)
            if got == [table[p // block_size] + p % block_size for p in range(n)]:
                return (
                    "a block id counts blocks, not slots: multiply it by block_size before adding the offset"
                )
            if got == list(range(n)):
                return "the blocks are not contiguous: look each logical block up in the block table"
            return (
                f"wrong slots for block_size {block_size}, block_table {table}: expected "
                f"{expected[:6]}..., got {got[:6]}..."
            )
    return None


WRONG_ANSWERS = {
    "3.1": [65, 66, 65.875, "68"],
    "3.2": [34, 13.28125, 53.125, 27.8528, 23.4375],
    "3.3": [0.128662109375, 87.1337890625, 0.7365],
    "3.4": [12, 7, 3, 4, 9],
    "3.5": [100, 112, 6],
    "3.6": [
        lambda table, n, bs: [table[p // bs] + p % bs for p in range(n)],
        lambda table, n, bs: list(range(n)),
        lambda table, n, bs: [table[p % bs] * bs + p // bs for p in range(n)],
        lambda table, n, bs: [table[p // bs] * bs + p % bs for p in range(n - 1)],
        42,
    ],
}
