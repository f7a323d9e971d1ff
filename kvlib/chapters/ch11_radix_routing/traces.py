"""Chapter 11's two seeded traces, as turns: multi-turn conversations and few-shot prompts.

- :func:`multi_turn_trace`: conversations behind one shared system prompt; turn ``k`` sends the
  system prompt, every earlier message and answer, then a new message, and its answer is drawn
  too (the simulator replays it as the generated tokens, so that a cache stores what the next turn
  sends). Turns of different conversations interleave in a seeded order; each conversation's turns
  keep theirs.
- :func:`few_shot_trace`: prompts of a few tasks, each an instruction and the first ``j`` of the
  task's worked examples (``j`` drawn per prompt), then a new question. Two prompts of one task
  share the instruction and their common examples, which rarely end at a block boundary.

Lengths are drawn uniformly between the bounds below; token ids from 1 to ``vocab_size - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlib.checks import require_int

VOCAB_SIZE = 512  # chapter 4's engine model's vocabulary: the traces run on it too
SYSTEM_LEN = 90  # the shared system prompt: five blocks of 16 and part of a sixth
USER_MESSAGE_LEN = (20, 60)  # a user's message, tokens (inclusive bounds)
ANSWER_LEN = (16, 48)  # an answer
NUM_TASKS = 4  # few-shot: tasks, each with its instruction and examples
INSTRUCTION_LEN = (30, 50)
NUM_SHOTS = 8  # worked examples per task; a prompt takes the first 2 to 8
EXAMPLE_LEN = (20, 40)
QUESTION_LEN = (10, 30)
FEW_SHOT_ANSWER_LEN = (8, 16)


@dataclass(frozen=True)
class Turn:
    """One request of a trace: its conversation (or task), prompt and answer."""

    conversation: int  # the conversation (few-shot: the task) it belongs to
    index: int  # its turn within the conversation (few-shot: 0)
    prompt: tuple[int, ...]
    answer: tuple[int, ...]  # the tokens it generates (the simulator replays them)


def _draws(seed):
    rng = np.random.default_rng(seed)

    def tokens(bounds) -> tuple[int, ...]:
        n = int(rng.integers(bounds[0], bounds[1] + 1))
        return tuple(int(t) for t in rng.integers(1, VOCAB_SIZE, n))

    return rng, tokens


def conversations(num_conversations: int, num_turns: int, seed: int = 0) -> list[list[Turn]]:
    """Each conversation's turns, in order (see the module's docstring)."""
    num_conversations = require_int(num_conversations, "num_conversations")
    num_turns = require_int(num_turns, "num_turns")
    rng, tokens = _draws([seed, 11])
    system = tokens((SYSTEM_LEN, SYSTEM_LEN))
    out = []
    for c in range(num_conversations):
        history, turns = system, []
        for k in range(num_turns):
            prompt = history + tokens(USER_MESSAGE_LEN)
            answer = tokens(ANSWER_LEN)
            turns.append(Turn(c, k, prompt, answer))
            history = prompt + answer
        out.append(turns)
    return out


def multi_turn_trace(num_conversations: int = 16, num_turns: int = 4, seed: int = 0) -> list[Turn]:
    """The conversations' turns interleaved in a seeded order, each conversation's in its own order."""
    convs = conversations(num_conversations, num_turns, seed)
    rng = np.random.default_rng([seed, 12])
    order = [c for c in range(num_conversations) for _ in range(num_turns)]
    rng.shuffle(order)
    nexts = [0] * num_conversations
    trace = []
    for c in order:
        trace.append(convs[c][nexts[c]])
        nexts[c] += 1
    return trace


def few_shot_trace(num_prompts: int = 64, seed: int = 0) -> list[Turn]:
    """Few-shot prompts: a task's instruction, its first ``j`` examples (2 to 8), a new question."""
    num_prompts = require_int(num_prompts, "num_prompts")
    rng, tokens = _draws([seed, 13])
    tasks = [
        (tokens(INSTRUCTION_LEN), [tokens(EXAMPLE_LEN) for _ in range(NUM_SHOTS)]) for _ in range(NUM_TASKS)
    ]
    trace = []
    for _ in range(num_prompts):
        task = int(rng.integers(NUM_TASKS))
        instruction, examples = tasks[task]
        shots = int(rng.integers(2, NUM_SHOTS + 1))
        prompt = instruction + sum(examples[:shots], ()) + tokens(QUESTION_LEN)
        trace.append(Turn(task, 0, prompt, tokens(FEW_SHOT_ANSWER_LEN)))
    return trace
