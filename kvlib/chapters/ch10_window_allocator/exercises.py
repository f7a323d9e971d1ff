"""Exercises of chapter 10 (Windows and hybrids in a paged allocator): the blocks a sliding window holds,
a pool's sequences with the admission peak, what Gemma-3's layout saves, and a Jamba sequence's blocks.

Each ``check_10_k`` computes the expected answer with kvlib (:mod:`kvlib.paged.hybrid_manager` and the
chapter's :mod:`~kvlib.chapters.ch10_window_allocator.capacity`), never typed in, and recognises the
usual mistakes by the answers they produce.
"""

from __future__ import annotations

import math

from kvlib.chapters.ch10_window_allocator.capacity import shape_layout
from kvlib.exercises.feedback import numeric_answer
from kvlib.paged.block_manager import num_blocks_for
from kvlib.paged.hybrid_manager import KVGroupSpec, first_needed_block, held_blocks_per_sequence

# ---- 10.1 the blocks one sliding group holds

WINDOW_1, BLOCK_SIZE_1, COMPUTED_1 = 4096, 16, 10_007  # window, block_size, tokens computed


def solve_10_1() -> int:
    """The next query (position 10,007) sees keys from 10,007 - 4,096 + 1 = 5,912 on: block 5,912 // 16 =
    369 is the first kept; the sequence has ceil(10,007 / 16) = 626 blocks, so 626 - 369 are held."""
    first_kept = (10_007 - 4096 + 1) // 16
    return math.ceil(10_007 / 16) - first_kept


def check_10_1(answer):
    """Exercise 10.1: blocks a 4,096-token window group holds after 10,007 computed tokens (16 a block)."""
    total = num_blocks_for(COMPUTED_1, BLOCK_SIZE_1)
    return numeric_answer(
        answer,
        total - first_needed_block(COMPUTED_1, WINDOW_1, BLOCK_SIZE_1),
        {
            WINDOW_1
            / BLOCK_SIZE_1: "the window rarely starts on a block boundary: count the blocks it touches",
            total: "that keeps every block; the window frees those wholly before its first key",
            math.ceil(WINDOW_1 / BLOCK_SIZE_1) + 2: "the first kept block is (10,007 - 4,096 + 1) // 16",
            WINDOW_1: "that is in tokens; answer in blocks",
        },
        rel=1e-9,
        what="ceil(computed / block_size) - (computed - window + 1) // block_size",
    )


# ---- 10.2 sequences in a pool, the admission peak included

POOL_BLOCKS_2, CONTEXT_2, BLOCK_SIZE_2 = 24_000, 8192, 16  # Gemma-2-9B's two groups of 21 layers
GROUPS_2 = (KVGroupSpec("window 4096", 21, 4096), KVGroupSpec("full", 21))


def solve_10_2() -> int:
    """Admitted whole, a sequence takes 2 x 512 = 1,024 blocks; computed, its window keeps 256 of its
    512, so it holds 768. The last one admitted still needs 1,024: (24,000 - 1,024) // 768 + 1."""
    return (24_000 - 1024) // 768 + 1


def check_10_2(answer):
    """Exercise 10.2: 8,192-token Gemma-2-9B sequences admitted one by one into 24,000 blocks (freeing)."""
    whole = len(GROUPS_2) * num_blocks_for(CONTEXT_2, BLOCK_SIZE_2)
    held = held_blocks_per_sequence(GROUPS_2, CONTEXT_2, BLOCK_SIZE_2)
    return numeric_answer(
        answer,
        (POOL_BLOCKS_2 - whole) // held + 1,
        {
            POOL_BLOCKS_2 // held: "a new sequence holds all 1,024 blocks until its prefill is computed",
            POOL_BLOCKS_2 / held: "sequences are whole, and the last one admitted needs 1,024 blocks",
            POOL_BLOCKS_2 // whole: "that is without freeing; the windows give back half of one group",
        },
        rel=1e-9,
        what="(pool - blocks at admission) // blocks held + 1",
    )


# ---- 10.3 what Gemma-3's layout saves

LOCAL_3, GLOBAL_3, WINDOW_3, CONTEXT_3 = 5, 1, 1024, 8192  # layers per period, window, tokens


def solve_10_3() -> float:
    """Kept: 6 layers x 8,192 tokens per period; freed: 1 x 8,192 + 5 x 1,024. The ratio of the two."""
    return 6 * 8192 / (1 * 8192 + 5 * 1024)


def check_10_3(answer):
    """Exercise 10.3: bytes a Gemma-3 sequence needs kept over freed, 8,192 tokens, no block rounding."""
    kept = (LOCAL_3 + GLOBAL_3) * CONTEXT_3
    freed = GLOBAL_3 * CONTEXT_3 + LOCAL_3 * min(WINDOW_3, CONTEXT_3)
    return numeric_answer(
        answer,
        kept / freed,
        {
            (LOCAL_3 + GLOBAL_3)
            / GLOBAL_3: "the global layer still holds its 8,192 tokens, but the local ones 1,024",
            CONTEXT_3 / WINDOW_3: "only the 5 local layers are capped; the global one keeps every token",
            freed / kept: "that is freed over kept; the ratio asked is kept over freed",
        },
        rel=1e-6,
        what="(all layers x context) / (global x context + local x window)",
    )


# ---- 10.4 a Jamba-v0.1 sequence's blocks

CONTEXT_4, BLOCK_SIZE_4 = 8192, 16


def solve_10_4() -> int:
    """Groups of 4 layers: 1 attention group (8,192 / 16 = 512 blocks) and 7 Mamba groups; a block is
    4 x 16 x 2 x 8 x 128 x 2 = 262,144 bytes, a group's state 4 x 2 x 4,096 x (4 + 16) x 2 = 1,310,720
    bytes = 5 blocks: 512 + 7 x 5."""
    page = 4 * 16 * 2 * 8 * 128 * 2
    state = 4 * 2 * 4096 * (4 + 16) * 2
    return 8192 // 16 + 7 * math.ceil(state / page)


def check_10_4(answer):
    """Exercise 10.4: blocks one 8,192-token Jamba-v0.1 sequence holds (groups of 4 layers, 16 a block)."""
    layout = shape_layout("Jamba-v0.1", BLOCK_SIZE_4)
    attention = num_blocks_for(CONTEXT_4, BLOCK_SIZE_4)
    states = [g.state_blocks for g in layout.groups if g.kind == "state"]
    return numeric_answer(
        answer,
        held_blocks_per_sequence(layout.groups, CONTEXT_4, BLOCK_SIZE_4),
        {
            attention: "the 28 Mamba layers keep a state too: it takes blocks of the same pool",
            attention + len(states): "one state of 4 layers is 1,310,720 bytes: it fills 5 blocks, not 1",
            attention + 4 * sum(states): "the 32 layers make 8 groups of 4: 1 attention, 7 Mamba",
            attention + sum(states) / 7 * 28: "a state group holds 4 layers: 7 groups, not 28",
        },
        rel=1e-9,
        what="attention blocks + Mamba groups x blocks per state",
    )


WRONG_ANSWERS = {
    "10.1": [256, 626, 258, 4096, 255, "257"],
    "10.2": [31, 31.25, 23, 24, 30.9, "30"],
    "10.3": [6, 8, 0.2708, 3, "3.69"],
    "10.4": [512, 519, 652, 652.0, 560, "547"],
}

# What check("10.k", ...) says before the exercise is answered: a nudge, never the answer
FIRST_HINTS = {
    "10.1": (
        "once n tokens are computed, the next query sees keys from n - window + 1 on: every block wholly "
        "before that key is free; count the blocks from the one holding it to the last"
    ),
    "10.2": (
        "a sequence admitted whole holds every block of its prompt until the pass is computed, then its "
        "window group gives back what falls out; the last sequence admitted needs the larger count"
    ),
    "10.3": "each layer keeps min(context, its window) tokens; a global layer has no window",
    "10.4": (
        "split the 32 layers into groups of 4 of one kind; each Mamba group's state takes whole blocks "
        "of the same pool, whose block is 4 layers x 16 tokens of K and V"
    ),
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "10.1": (check_10_1, solve_10_1),
    "10.2": (check_10_2, solve_10_2),
    "10.3": (check_10_3, solve_10_3),
    "10.4": (check_10_4, solve_10_4),
}
