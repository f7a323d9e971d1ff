"""Chapter 4's exercise 4.6 ("Serving under a memory budget"): a preemption policy in the simulator.

The reader writes the rule that picks which running request to preempt; :func:`check_4_6` tries it
on hand-made sets of requests, then runs :func:`kvlib.serving.simulator.simulate` with it on a small
seeded trace and compares every request's preemptions and finishing step with the reference's.
:mod:`kvlib.chapters.ch04_serving.exercises` holds the chapter's other exercises and imports this one.
"""

from __future__ import annotations

import math
import random

from kvlib.exercises.feedback import as_number
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import Request, TraceSpec, make_trace
from kvlib.serving.types import SeqState


def solve_4_6():
    """Preempt the request that holds the most K/V (the longest sequence); among equals, the youngest."""

    def most_kv(running):
        # running: the requests that may be preempted, oldest first. max() keeps the first of equal
        # maxima, so it runs over the youngest first.
        return max(reversed(running), key=lambda seq: len(seq.tokens))

    return most_kv


# The check's trace: 40 requests queued at once, served with paging in 1,024 slots, one step per time
# unit. FCFS preempts 30 times there, the longest-first rule 15 times, and the wrong rules below each
# differ from it in some request's preemptions or finishing step.
CH4_6_TRACE = TraceSpec("exercise 4.6", 30, 60, max_len=256)
CH4_6_SLOTS = 1024
ONE_UNIT = StepTimeModel(1.0, 0.0, 0.0, 0.0)


def _waiting_seq(req_id: int, prompt_len: int, generated: int, output_len: int) -> SeqState:
    """A running request of the check's hand-made cases: ``generated`` tokens after its prompt."""
    request = Request(req_id, float(req_id), tuple(range(prompt_len)), output_len)
    return SeqState(request, list(request.prompt) + [0] * generated, num_generated=generated)


# Hand-made cases, oldest first: (prompt, generated, output) per running request. They tell the rule
# (the longest; the youngest of equals) from each usual mistake by the request it picks.
CH4_6_CASES = (
    ((20, 0, 300), (30, 10, 40), (5, 5, 40), (25, 5, 40)),  # lengths 20, 40, 10, 30
    ((40, 0, 10), (20, 5, 400), (30, 10, 20), (25, 0, 20)),  # 40, 25, 40, 25: a tie of the longest
    ((30, 0, 10), (10, 30, 40), (20, 5, 200)),  # 30, 40, 25: the longest has the shortest prompt
    ((50, 2, 10), (10, 20, 30), (30, 5, 300)),  # 52, 30, 35: the longest has generated least
    ((10, 3, 20),),  # one request: it is the victim
)


def _longest(key):
    """The longest by ``key``, the youngest among equals."""
    return lambda running: max(reversed(running), key=key)


def _first_longest(key):
    """The longest by ``key``, the oldest among equals (what ``max(running, key=key)`` returns)."""
    return lambda running: max(running, key=key)


CH4_6_MISTAKES = (  # a usual wrong rule (in both tie-breaks where it has ties), and the hint for it
    (
        (lambda running: running[-1],),
        "that is first come, first served's rule (the youngest, the last of running), the scheduler's "
        "default; pick by the K/V each request holds",
    ),
    (
        (lambda running: running[0],),
        "running[0] is the oldest candidate: the request that asks for the slot itself, so it gives up "
        "its own turn; the rule picks the request holding the most K/V",
    ),
    (
        (_first_longest(lambda seq: len(seq.tokens)),),
        "right rule, wrong tie: max() keeps the first (oldest) of equally long requests; among equals "
        "the rule picks the youngest",
    ),
    (
        (_longest(lambda seq: -len(seq.tokens)), _first_longest(lambda seq: -len(seq.tokens))),
        "you preempt the SHORTEST request, which frees the least memory: the rule takes the longest",
    ),
    (
        (_longest(lambda seq: seq.request.prompt_len), _first_longest(lambda seq: seq.request.prompt_len)),
        "the prompt is only part of what a request holds: count its generated tokens too, len(seq.tokens)",
    ),
    (
        (_longest(lambda seq: seq.num_generated), _first_longest(lambda seq: seq.num_generated)),
        "the generated tokens are only part of what a request holds: count its prompt too, len(seq.tokens)",
    ),
    (
        (_longest(lambda seq: seq.request.total_len), _first_longest(lambda seq: seq.request.total_len)),
        "request.total_len is the length the request WILL reach (no real server knows it); what it holds "
        "now is len(seq.tokens)",
    ),
)


def _pick(answer, running):
    """The position in ``running`` of the request ``answer`` picks, or a hint (a str) on why there is none."""
    try:
        chosen = answer(running)
    except Exception as error:  # the reader's code: report, do not crash
        if isinstance(error, AttributeError | TypeError) and any(
            word in str(error) for word in ("'pop'", "'remove'", "item deletion", "item assignment")
        ):
            return (
                "running is a tuple the scheduler lends you: return one of its requests and let the "
                "scheduler preempt it, do not remove it yourself"
            )
        return f"your function raised {type(error).__name__}: {error}"[:200]
    for position, seq in enumerate(running):
        if chosen is seq:
            return position
    if as_number(chosen) is not None:
        return (
            f"your function returned the number {chosen!r}: return the request itself (an element of "
            "running), not its position or its length"
        )
    return (
        f"your function returned {chosen!r}"[:80]
        + f" ({type(chosen).__name__}), not one of the requests in running"
    )


def _outcome(victim):
    """Each request's preemptions and finishing step on the check's trace, served with ``victim``."""
    run = simulate(
        make_trace(CH4_6_TRACE, 40, math.inf, seed=2), "paged", CH4_6_SLOTS, ONE_UNIT, 256, victim=victim
    )
    return {seq.seq_id: (seq.num_preemptions, seq.finish_s) for seq in run.finished}, run.num_preemptions


def check_4_6(answer):
    """Exercise 4.6: a reader's preemption policy (the longest request, the youngest of equals), run in the
    simulator and compared with the reference's preemptions and schedule.

    None if right, else a hint that names the likely mistake: first on hand-made sets of running
    requests (each usual wrong rule picks a different one), then on a seeded trace served by
    :func:`kvlib.serving.simulator.simulate` with ``victim=answer``.
    """
    if not callable(answer):
        return "answer with a function most_kv(running) that returns one of the requests in running"
    cases = [tuple(_waiting_seq(i, *spec) for i, spec in enumerate(case)) for case in CH4_6_CASES]
    picks = []
    for running in cases:
        tries = {_pick(answer, running) for _ in range(8)}
        hints = [t for t in tries if isinstance(t, str)]
        if hints:
            return hints[0]
        if len(tries) > 1:
            return (
                "your function picks different requests from the same running requests: a preemption "
                "policy must be a rule (random choice is none), or no run can be repeated or explained"
            )
        picks.append(tries.pop())
    expected = [_pick(solve_4_6(), running) for running in cases]
    if picks != expected:
        for rules, hint in CH4_6_MISTAKES:
            if any(picks == [_pick(rule, running) for running in cases] for rule in rules):
                return hint
        case = next(i for i, (got, want) in enumerate(zip(picks, expected, strict=True)) if got != want)
        lengths = [len(seq.tokens) for seq in cases[case]]
        return (
            f"from running requests holding {lengths} tokens (oldest first) your function picks the one "
            f"at position {picks[case]}; the rule frees the most memory (the youngest of equals)"
        )
    try:
        got, got_total = _outcome(answer)
    except Exception as error:  # the reader's code, inside the simulator
        return f"in the simulator your function failed: {type(error).__name__}: {error}"[:200]
    want, want_total = _outcome(solve_4_6())
    if got != want and got == _outcome(_longest(lambda seq: -(-(len(seq.tokens) - 1) // 16)))[0]:
        return (
            "counted in blocks of 16, many requests tie that tokens tell apart: compare len(seq.tokens), "
            "the K/V each holds, and free the most of it"
        )
    if got != want:
        first = next(i for i in sorted(want) if got.get(i) != want[i])
        return (
            f"on the check's trace your policy preempts {got_total} times where the rule preempts "
            f"{want_total}; request {first} is the first whose preemptions or finishing step differ"
        )
    return None


WRONG_ANSWERS_4_6 = [  # exercise 4.6's wrong answers, each with its own hint (ch4.WRONG_ANSWERS)
    *(rule for rules, _ in CH4_6_MISTAKES for rule in rules),
    lambda running: random.choice(running),
    lambda running: len(running) - 1,  # a position, not a request
    lambda running: running.pop(),
    _longest(lambda seq: -(-(len(seq.tokens) - 1) // 16)),  # its blocks of 16: ties that tokens break
    lambda running: None,
    "longest",
]
