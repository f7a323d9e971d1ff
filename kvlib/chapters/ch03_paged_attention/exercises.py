"""Exercises of chapter 3: what paging and reservation waste, fork and copy-on-write, a block manager
of the reader's own, prefix caching, a paged gather and the slot mapping.

Each ``check_3_k`` computes the expected answer with :mod:`kvlib.paged` (never typed in) and
recognises the usual mistakes by the numbers they produce. The implementation exercise 3.3 (a
block manager with copy-on-write, graded against kvlib's) lives in
:mod:`kvlib.chapters.ch03_paged_attention.block_manager_exercise`;
exercise 3.5 grades a reader's gather with :func:`kvlib.kernels.torch_gather.gather_blocks`.
``FIRST_HINTS``: what the chapter prints for an exercise not answered yet.
"""

from __future__ import annotations

import torch

# exercise 3.3 (a block manager the reader writes) lives in its own module, listed in EXERCISES below
from kvlib.chapters.ch03_paged_attention.block_manager_exercise import (
    WRONG_CLASSES,
    SmallBlockManager,
    check_3_3,
    solve_3_3,
)
from kvlib.exercises.feedback import as_items, as_number, numeric_answer  # answers as lists and numbers
from kvlib.kernels.torch_gather import gather_blocks
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.usage import block_usage
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import bytes_per_token
from kvlib.units import MiB, ceil_div

LENGTHS = (1000, 37, 16, 1)  # the four requests of exercise 3.1
BLOCK_SIZE = 16
CH3_MAX_LEN = 2048  # tokens a contiguous reservation holds (exercise 3.1)

FIRST_HINTS = {
    "3.1": (
        "Round up per request (a block never holds tokens of two requests); the empty slots are the "
        "blocks' slots minus the tokens, and chapter 2 gives a token's bytes."
    ),
    "3.2": (
        "fork copies no block, only the table. Take the branches' appends one by one: is the last "
        "block still shared (ref_cnt > 1) when that branch writes?"
    ),
    "3.3": (
        "Start from three pieces of state: a list of free block ids, a ref_cnt per block and a block "
        "table per sequence; write allocate and free first, then fork, then append_slot."
    ),
    "3.4": "Prefix caching reuses whole blocks only: which blocks hold nothing but system-prompt tokens?",
    "3.5": (
        "Index the pool with the block table to get the sequence's blocks in order, then make the block "
        "and slot axes one axis of tokens."
    ),
    "3.6": (
        "Find, for token p, its logical block and its offset in that block; the block table turns the "
        "logical block into a physical one."
    ),
}


def _blocks_used(lengths, block_size: int = BLOCK_SIZE) -> int:
    manager = BlockManager(num_blocks=sum(lengths), block_size=block_size, enable_prefix_caching=False)
    for seq_id, n in enumerate(lengths):
        manager.allocate(seq_id, [0] * n)
    return block_usage(manager).num_used_blocks


# ---- 3.1 what paging and reservation waste


def solve_3_1() -> tuple[int, float, float]:
    """Blocks: ceil(n / 16) for each request. Paging's waste: the last blocks' empty slots x the bytes
    of a token of OPT-13B (40 layers, 5,120 wide, fp16), in MiB. Reservation: the empty share of
    2,048 slots per request."""
    blocks = sum(ceil_div(n, BLOCK_SIZE) for n in LENGTHS)
    empty_slots = blocks * BLOCK_SIZE - sum(LENGTHS)
    mib = empty_slots * 2 * 40 * 5120 * 2 / 2**20
    return blocks, mib, 1 - sum(LENGTHS) / (len(LENGTHS) * CH3_MAX_LEN)


def _blocks_hint(answer):
    """The blocks the four requests take, counted by the block manager: None if right, else a hint."""
    total, rounded_down = sum(LENGTHS), sum(n // BLOCK_SIZE for n in LENGTHS)
    whole = ceil_div(total, BLOCK_SIZE)
    mistakes = {
        rounded_down: "you rounded down: a partly filled last block is still a whole block",
        whole: "blocks belong to one sequence each: round up per request, not the total",
        total / BLOCK_SIZE: "blocks are whole: round up per request",
    }
    return numeric_answer(
        answer, _blocks_used(LENGTHS), mistakes, rel=0, what="ceil(length / 16) per request"
    )


def _paging_hint(answer):
    """What the last blocks' empty slots waste for OPT-13B, in MiB: None if right, else a hint."""
    per_token = bytes_per_token(catalog_entry("OPT-13B").spec)
    empty = _blocks_used(LENGTHS) * BLOCK_SIZE - sum(LENGTHS)
    expected, half_blocks = empty * per_token / MiB, len(LENGTHS) * (BLOCK_SIZE - 1) / 2 * per_token / MiB
    mistakes = {
        float(
            empty
        ): "that is the number of empty slots; multiply by the bytes a token takes in OPT-13B's cache",
        expected / 2: "a token stores a key AND a value in every layer: the factor 2 is missing",
        expected * 2: "fp16 takes 2 bytes per value, not 4",
        expected * MiB / 1e6: "that is in MB of 10^6 bytes; answer in MiB (2^20 bytes)",
        half_blocks: "that is the expected waste (half a block per request); count the real empty slots",
    }
    return numeric_answer(
        answer, expected, mistakes, rel=1e-3, what="(blocks x 16 - tokens) x bytes per token"
    )


def _reservation_hint(answer):
    """The empty share of slots when every request reserves 2,048: None if right, else a hint."""
    used, reserved = sum(LENGTHS), len(LENGTHS) * CH3_MAX_LEN
    expected, longest = 1 - used / reserved, 1 - used / (len(LENGTHS) * max(LENGTHS))
    mistakes = {
        used / reserved: "that is the fraction holding tokens; the question asks for the empty fraction",
        100 * expected: "give a fraction between 0 and 1, not a percentage",
        longest: "every request reserves the model's maximum length (2,048), not the longest request",
    }
    return numeric_answer(answer, expected, mistakes, rel=1e-3, what="1 - tokens / (requests x 2,048)")


def check_3_1(answer):
    """Exercise 3.1: (blocks, MiB the blocks leave empty, empty fraction of a 2,048-slot reservation).

    None if right, else a hint that names the part and the likely mistake.
    """
    parts = as_items(answer, most=3)
    if parts is None or len(parts) != 3:
        return "answer with three numbers: (blocks, MiB left empty, empty fraction when reserving 2,048)"
    hints = (_blocks_hint, _paging_hint, _reservation_hint)
    for part, hint_of, value in zip(("blocks", "MiB", "fraction"), hints, parts, strict=True):
        if hint := hint_of(value):
            return f"{part}: {hint}"
    return None


# ---- 3.2 fork and copy-on-write


def solve_3_2() -> int:
    """37 tokens = 3 blocks (the last holds 5). Four branches share them; the first three to
    append copy the shared last block, the fourth is then its only user and writes in place."""
    return 3 + 3


def check_3_2(answer):
    """Exercise 3.2: blocks in use once four forked branches have each appended a token (copy-on-write).

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
    mistakes = {
        12: "the branches share the prompt's blocks (fork only increments ref_cnt); only the shared last "
        "block is copied",
        7: "the last branch to append is the block's only user by then (ref_cnt 1): it writes in place, "
        "no copy",
        3: "a branch never writes into a block others still use: the first write to the shared last block "
        "copies it",
        4: "every branch but the last needs its own copy of the partly filled last block",
        9: "full blocks are never written again, so they stay shared; only the partly filled last block is "
        "copied",
    }
    used = block_usage(manager).num_used_blocks
    return numeric_answer(answer, used, mistakes, rel=0, what="shared blocks + copies")


# ---- 3.4 prefix caching


def solve_3_4() -> int:
    """Only full blocks are hashed and cached: 100 // 16 = 6 blocks of the system prompt."""
    return 100 // 16 * 16


def check_3_4(answer):
    """Exercise 3.4: the prompt tokens a second request with the same system prompt finds cached.

    None if right, else a hint that names the likely mistake.
    """
    system, user = list(range(100)), list(range(1000, 1020))
    manager = BlockManager(num_blocks=32, block_size=BLOCK_SIZE)
    manager.allocate(0, system + user)
    manager.mark_computed(0)
    cached = manager.allocate(1, system + list(range(2000, 2020))).num_cached_tokens
    mistakes = {
        100: "only FULL blocks are cached, and the 7th block mixes system-prompt and user tokens, so it "
        "differs",
        112: "round down: the 7th block is not identical in the two requests",
        6: "that is the number of blocks; the question asks for tokens",
    }
    return numeric_answer(answer, cached, mistakes, rel=0, what="whole blocks inside the shared prefix")


# ---- 3.5 a paged gather


def solve_3_5():
    """Index the pool with the table (blocks in table order), then one axis of tokens, cut at the length."""

    def gather(k_pool, block_table, length):
        blocks = k_pool[block_table]  # (len(block_table), block_size, kv_heads, head_dim)
        return blocks.flatten(0, 1)[:length]  # (len(block_table) * block_size, ...) -> (length, ...)

    return gather


GATHER_CASES = (  # (num_blocks, block_size, kv_heads, head_dim, dtype) of the pools the check builds
    (16, 4, 2, 8, torch.float32),
    (9, 1, 1, 4, torch.float32),
    (12, 5, 3, 6, torch.float32),
    (32, 16, 4, 64, torch.float16),
    (40, 8, 2, 16, torch.bfloat16),
)
HINT_NOT_CUT = (
    "keep only the first `length` rows: the rest of the last block holds no token of this sequence "
    "(only what an earlier owner of the block left there)"
)
HINT_BLOCK_AXES = (
    "join the block and slot axes into one axis of tokens: the result is (length, kv_heads, head_dim)"
)
HINT_POOL_ORDER = (
    "the sequence's blocks are not the pool's first ones, nor in the pool's order: look each logical block "
    "up in the block table"
)
HINT_SLOT_MAJOR = (
    "token j lies in logical block j // block_size at offset j % block_size: each block holds "
    "block_size consecutive tokens, and the blocks follow one another"
)


def _gather_case(case: int):
    """Case ``case`` of :data:`GATHER_CASES`: a random pool, a shuffled block table and a length."""
    num_blocks, block_size, kv_heads, head_dim, dtype = GATHER_CASES[case]
    gen = torch.Generator().manual_seed(case)
    pool = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    num_seq_blocks = 2 + case  # 2 to 6 blocks, placed at random
    table = torch.randperm(num_blocks, generator=gen)[:num_seq_blocks].tolist()
    if table == sorted(table):
        table.reverse()  # never in the pool's order: a reader who ignores the table must fail
    last = 1 + int(torch.randint(block_size, (1,), generator=gen))  # tokens in the last block
    return pool, table, (num_seq_blocks - 1) * block_size + last


def _gather_hint(got, pool: torch.Tensor, table: list[int], length: int) -> str | None:
    """None if ``got`` is the sequence's K, else what is wrong with it."""
    if not isinstance(got, torch.Tensor):
        return f"your function returned {got!r}"[:80] + f" ({type(got).__name__}), not a torch tensor"
    _, block_size, kv_heads, head_dim = pool.shape
    blocks = gather_blocks(pool, torch.tensor([table]))[0]  # (len(table) * block_size, kv_heads, head_dim)
    expected = blocks[:length]
    shape, want = tuple(got.shape), tuple(expected.shape)
    if shape == tuple(blocks.shape) and shape != want:
        return HINT_NOT_CUT
    if shape == (len(table), block_size, kv_heads, head_dim):
        return HINT_BLOCK_AXES
    if shape in ((length - 1, kv_heads, head_dim), (length + 1, kv_heads, head_dim)):
        return f"off by one: {length} tokens are rows 0 to {length - 1}, {length} rows in all"
    if shape != want:
        return f"your tensor is {shape}; the sequence's K is (length, kv_heads, head_dim) = {want}"
    if got.dtype != pool.dtype:
        return (
            f"your tensor is {got.dtype}, the pool {pool.dtype}: a gather copies values, it converts nothing"
        )
    if torch.equal(got, expected):
        return None
    if torch.equal(got, pool.flatten(0, 1)[:length]):
        return HINT_POOL_ORDER
    if torch.equal(got, pool[table].transpose(0, 1).flatten(0, 1)[:length]):
        return HINT_SLOT_MAJOR
    row = int((got != expected).flatten(1).any(1).nonzero()[0])
    return (
        f"row {row} should be k_pool[block_table[{row} // block_size], {row} % block_size] (block_size "
        f"{block_size}, block_table {table})"
    )


def check_3_5(answer):
    """Exercise 3.5: a reader's gather(k_pool, block_table, length), against kvlib's gather_blocks.

    None if right, else a hint that names the likely mistake.
    """
    if not callable(answer) or isinstance(answer, type):
        return "answer with a function gather(k_pool, block_table, length) that returns the sequence's K"
    for case in range(len(GATHER_CASES)):
        pool, table, length = _gather_case(case)
        untouched = pool.clone()
        try:
            got = answer(pool, list(table), length)
        except Exception as error:  # the reader's code: report, do not crash
            return f"your function raised {type(error).__name__}: {error}"
        if not torch.equal(pool, untouched):
            return "your function changed the pool: a gather only reads it"
        hint = _gather_hint(got, pool, table, length)
        if hint:
            shape = tuple(pool.shape)
            return f"{hint} (pool {shape} {str(pool.dtype).removeprefix('torch.')}, length {length})"
    return None


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
            items = as_items(returned)
            if items is None:
                return (
                    f"your function returned {returned!r}"[:80]
                    + f" ({type(returned).__name__}), not a list of slots"
                )
            got = [as_number(slot) for slot in items]  # numpy or torch integers compare as ints
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
    "3.1": [
        (65, 26.5625, 0.871337890625),
        (66, 26.5625, 0.871337890625),
        (65.875, 26.5625, 0.871337890625),
        ("68", 26.5625, 0.871337890625),
        *((68, mib, 0.871337890625) for mib in (34, 13.28125, 53.125, 27.8528, 23.4375)),
        *((68, 26.5625, fraction) for fraction in (0.128662109375, 87.1337890625, 0.7365)),
        68,
        "68, 26.5625, 0.8713",
    ],
    "3.2": [12, 7, 3, 4, 9],
    "3.3": [*WRONG_CLASSES, SmallBlockManager(12, 4, print), 42],
    "3.4": [100, 112, 6],
    "3.5": [
        lambda pool, table, n: pool[table].flatten(0, 1),  # not cut at the length
        lambda pool, table, n: pool[table],  # blocks not joined into tokens
        lambda pool, table, n: pool.flatten(0, 1)[:n],  # the pool's first blocks, no table
        lambda pool, table, n: pool[table].transpose(0, 1).flatten(0, 1)[:n],  # slot-major
        lambda pool, table, n: pool[table].flatten(0, 1)[: n - 1],  # off by one
        lambda pool, table, n: pool[table].flatten(0, 1)[:n].float(),  # converted
        lambda pool, table, n: pool[table].flatten(0, 1)[:n].numpy(),  # not a tensor
        42,
    ],
    "3.6": [
        lambda table, n, bs: [table[p // bs] + p % bs for p in range(n)],
        lambda table, n, bs: list(range(n)),
        lambda table, n, bs: [table[p % bs] * bs + p // bs for p in range(n)],
        lambda table, n, bs: [table[p // bs] * bs + p % bs for p in range(n - 1)],
        42,
    ],
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "3.1": (check_3_1, solve_3_1),
    "3.2": (check_3_2, solve_3_2),
    "3.3": (check_3_3, solve_3_3),
    "3.4": (check_3_4, solve_3_4),
    "3.5": (check_3_5, solve_3_5),
    "3.6": (check_3_6, solve_3_6),
}
