"""Exercises of chapter 11 (a radix prefix tree, and cache-aware routing): the hits of a branch mid-block,
the hits of a returning turn, where the prefix-aware router sends two requests, and how often
round-robin finds a conversation's history.

Each ``check_11_k`` computes the expected answer with kvlib (the chapter's caches replay the prompts,
the chapter's :class:`~kvlib.chapters.ch11_radix_routing.routing.Router` routes the requests), never
typed in, and recognises the usual mistakes by the answers they produce.
"""

from __future__ import annotations

from kvlib.chapters.ch11_radix_routing.hit_rates import CACHES, make_manager, replay
from kvlib.chapters.ch11_radix_routing.routing import Router
from kvlib.chapters.ch11_radix_routing.traces import Turn
from kvlib.exercises.feedback import numeric_answer


def _pair(answer) -> list | None:
    if not isinstance(answer, tuple | list) or len(answer) != 2:
        return None
    return list(answer)


def _both(parts, rights: tuple, mistakes: list[dict], what: str, names=("hash", "radix")) -> str | None:
    for part, right, wrong, name in zip(parts, rights, mistakes, names, strict=True):
        hint = numeric_answer(part, right, wrong, rel=1e-9, what=what)
        if hint:
            return f"{name}: {hint}"
    return None


def _second_hits(first, answer, second) -> tuple[int, int]:
    """Cached tokens of the second prompt under the hash cache (blocks of 16) and the tree (pages of 1)."""
    trace = [Turn(0, 0, first, answer), Turn(0, 1, second, (1,))]
    return tuple(replay(make_manager(kind, 4096), trace).hits[1] for kind in (CACHES[0], CACHES[2]))


# ---- 11.1 a branch mid-block

SHARED = 100  # tokens two prompts share before they part
TAIL = 30  # tokens after the branch, each prompt its own


def solve_11_1() -> tuple[int, int]:
    """The hash cache finds whole blocks only: 6 x 16 = 96; the tree finds all 100 shared tokens."""
    return 100 // 16 * 16, 100


def check_11_1(answer):
    """Exercise 11.1: cached tokens of the second prompt, hash cache (blocks of 16) and tree (pages of 1).

    None if right, else a hint that names the likely mistake.
    """
    parts = _pair(answer)
    if parts is None:
        return "answer with a tuple (hash_tokens, radix_tokens): two whole numbers"
    first = tuple(range(1, SHARED + 1)) + tuple(range(500, 500 + TAIL))
    second = tuple(range(1, SHARED + 1)) + tuple(range(700, 700 + TAIL))
    hashed, radix = _second_hits(first, (1,), second)
    mistakes = [
        {
            SHARED: "the hash cache finds whole blocks only: the block with the branch point is not shared",
            -(-SHARED // 16) * 16: "round down: the block holding tokens 97 to 112 differs after token 100",
            SHARED // 16: "that counts blocks; answer in tokens",
        },
        {
            hashed: "a tree with one token a page matches every shared token, not whole blocks",
            SHARED + TAIL: "the prompts part after token 100: only the shared tokens match",
        },
    ]
    return _both(parts, (hashed, radix), mistakes, "the shared tokens, in whole blocks for the hash cache")


# ---- 11.2 a returning turn

PROMPT_LEN, ANSWER_LEN, MESSAGE_LEN = 70, 25, 30


def solve_11_2() -> tuple[int, int]:
    """K/V exist for the prompt and all but the answer's last token: 70 + 24 = 94 tokens; 5 whole blocks
    of 16 are 80."""
    computed = 70 + 25 - 1
    return computed // 16 * 16, computed


def check_11_2(answer):
    """Exercise 11.2: cached tokens of a conversation's next turn, hash cache and radix tree.

    None if right, else a hint that names the likely mistake.
    """
    parts = _pair(answer)
    if parts is None:
        return "answer with a tuple (hash_tokens, radix_tokens): two whole numbers"
    prompt, reply = tuple(range(1, PROMPT_LEN + 1)), tuple(range(200, 200 + ANSWER_LEN))
    hashed, radix = _second_hits(prompt, reply, prompt + reply + tuple(range(400, 400 + MESSAGE_LEN)))
    history = PROMPT_LEN + ANSWER_LEN
    mistakes = [
        {
            history // 16 * 16 + 16: "round down: a block that is not full is never cached by hash",
            PROMPT_LEN // 16 * 16: "the answer's tokens have K/V too (the decode wrote them): count them",
            radix: "the hash cache keeps whole blocks only",
        },
        {
            history: "the answer's last token was never fed through the model: it has no K/V yet",
            PROMPT_LEN: "the answer's tokens have K/V too (the decode wrote them), and the tree keeps them",
            hashed: "a tree with one token a page keeps the partial last block's tokens too",
        },
    ]
    return _both(parts, (hashed, radix), mistakes, "the tokens with K/V after the first turn")


# ---- 11.3 where the prefix-aware router sends two requests

PROMPT_TOKENS = 200
MATCHED = (150, 20, 0, 90)  # tokens of the prompt each replica's router tree holds
LOADS_A = (30, 4, 6, 9)  # requests in flight per replica, first case
LOADS_B = (40, 4, 6, 9)  # second case


def solve_11_3() -> tuple[int, int]:
    """(a) 30 - 4 = 26 is not past 32: the cache rule, 150 / 200 = 0.75 > 0.5, picks replica 0.
    (b) 40 - 4 = 36 > 32 and 40 > 1.0001 x 4: the load rule picks the least loaded, replica 1."""
    return 0, 1


def _routed(loads) -> int:
    prompt = tuple(range(1, PROMPT_TOKENS + 1))
    router = Router("prefix-aware", len(MATCHED), 10_000)
    for tree, matched in zip(router.trees, MATCHED, strict=True):
        if matched:
            tree.insert(prompt[:matched] + (9999,))
    router.loads = list(loads)
    return router._prefix_aware(prompt)


def check_11_3(answer):
    """Exercise 11.3: the replica sgl-router's cache-aware policy picks, at each of two sets of loads.

    None if right, else a hint that names the likely mistake.
    """
    parts = _pair(answer)
    if parts is None:
        return "answer with a tuple (replica_a, replica_b): two replica numbers from 0"
    first, second = _routed(LOADS_A), _routed(LOADS_B)
    mistakes = [
        {
            1: "at loads 30 and 4 the difference is 26, not past 32: the load rule stays silent",
            3: "the cache rule picks the best match, 150 of 200 tokens, not a close second",
        },
        {
            0: "at loads 40 and 4 the difference is 36 > 32, and 40 > 1.0001 x 4: the load rule decides",
            2: "the load rule picks the least-loaded replica",
        },
    ]
    return _both(parts, (first, second), mistakes, "the load rule first, then the cache rule", ("a", "b"))


# ---- 11.4 round-robin and a conversation's history

EXERCISE_REPLICAS = 4


def solve_11_4() -> float:
    """Each later turn lands on its previous turn's replica with probability 1 / 4."""
    return 1 / 4


def check_11_4(answer):
    """Exercise 11.4: the share of a conversation's later turns that land where its previous turn ran.

    None if right, else a hint that names the likely mistake.
    """
    right = 1 / EXERCISE_REPLICAS
    return numeric_answer(
        answer,
        right,
        {
            0: "nothing stops round-robin from sending a turn back to the same replica: count the chances",
            1 - right: "that is the share that lands elsewhere, and misses its history",
            1
            / (EXERCISE_REPLICAS - 1): "the previous replica is one of the 4 the turn may land on, not of 3",
            100 * right: "answer as a share (0 to 1), not a percentage",
        },
        rel=1e-6,
        what="1 / replicas",
    )


# ---- realistic mistakes, which tests/test_exercises.py feeds to the checks

WRONG_ANSWERS = {
    "11.1": [(100, 100), (112, 100), (6, 100), (96, 96), (96, 130), 96, (96,)],
    "11.2": [(96, 94), (64, 94), (80, 95), (80, 70), (80, 80), (94, 94), None],
    "11.3": [(1, 1), (3, 1), (0, 0), (0, 2), 0, (0,)],
    "11.4": [0, 0.75, 1 / 3, 25, "0.25"],
}

# What check("11.k", ...) says before the exercise is answered: a nudge, never the answer
FIRST_HINTS = {
    "11.1": "the hash cache names whole blocks by their chained hash; a tree edge may end at any token",
    "11.2": (
        "count the tokens whose K/V exist when the first turn ends: its prompt and the answer's tokens "
        "that went through the model; then whole blocks for the hash cache"
    ),
    "11.3": "sgl-router checks the load rule first (both thresholds), and only then the cache rule",
    "11.4": "where does round-robin send a turn, and how does that relate to where the previous turn went?",
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "11.1": (check_11_1, solve_11_1),
    "11.2": (check_11_2, solve_11_2),
    "11.3": (check_11_3, solve_11_3),
    "11.4": (check_11_4, solve_11_4),
}
