"""What the scheduler and the memory policies share (kvlib.serving.types): every policy keeps the
Memory contract, a step plan's totals, and the step record's fields."""

import dataclasses
import inspect

import pytest

from kvlib.paged.block_manager import BlockManager
from kvlib.serving.placement import POLICIES, make_memory
from kvlib.serving.traces import Request
from kvlib.serving.types import CATEGORIES, Memory, SeqState, StepPlan, StepRecord

CONTRACT = ("admit", "append", "release", "mark_computed", "breakdown")


def memories():
    """Every policy of make_memory, and the variants it builds: another allocator, prefix caching, a
    real block manager behind a reservation."""
    for policy in POLICIES:
        yield policy, make_memory(policy, 4096, 2048)
    yield "oracle, first fit", make_memory("oracle", 4096, 2048, allocator="first-fit")
    yield "paged, prefix caching", make_memory("paged", 4096, 2048, enable_prefix_caching=True)
    yield "max, manager", make_memory("max", 4096, 2048, manager=BlockManager(256, 16))


@pytest.mark.parametrize("name, memory", list(memories()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_memory_policy_keeps_the_memory_contract(name, memory):
    assert isinstance(memory, Memory), name
    for method in CONTRACT:
        promised = inspect.signature(getattr(Memory, method))
        kept = inspect.signature(getattr(type(memory), method))
        assert list(kept.parameters) == list(promised.parameters), (name, method)
        assert kept.return_annotation == promised.return_annotation, (name, method)


def test_a_memory_answers_the_scheduler_in_the_contracts_words():
    for _, memory in memories():
        seq = SeqState(Request(0, 0.0, tuple(range(20)), 5), list(range(20)))
        assert memory.admit(seq) == 0  # nothing cached yet
        seq.tokens.append(99)
        assert memory.append(seq) is True
        memory.mark_computed(StepPlan(((seq, 0),), ()))
        head = SeqState(Request(1, 0.0, (1, 2, 3), 1), [1, 2, 3])
        slots = memory.breakdown(21, head)
        assert len(slots) == len(CATEGORIES) and sum(slots) == memory.num_slots
        memory.release(seq)
        assert sum(memory.breakdown(0, None)) == memory.num_slots


def test_an_object_missing_part_of_the_contract_is_no_memory():
    class NoBreakdown:
        num_slots = 16

        def admit(self, seq):
            return 0

        def append(self, seq):
            return True

        def release(self, seq):
            pass

        def mark_computed(self, plan):
            pass

    assert not isinstance(NoBreakdown(), Memory)


def test_a_step_plan_is_frozen_and_totals_what_it_computes_when_made():
    prompt = SeqState(Request(0, 0.0, tuple(range(10)), 3), list(range(10)))
    decoding = SeqState(Request(1, 0.0, (1, 2), 5), [1, 2, 7, 8])
    plan = StepPlan(((prompt, 4),), (decoding,))
    assert (plan.num_prefill_tokens, plan.num_context_tokens, plan.num_seqs) == (10 - 4, 4, 2)
    assert plan.seqs == [prompt, decoding]  # the order of the step's new tokens
    decoding.tokens.append(9)  # the scheduler's next token does not change the plan
    assert plan.num_context_tokens == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.num_prefill_tokens = 0
    with pytest.raises(TypeError):
        StepPlan((), (), 5)  # the totals are computed, never given


def test_a_step_record_ends_with_the_budgets_categories():
    names = [f.name for f in dataclasses.fields(StepRecord)]
    assert tuple(names[-len(CATEGORIES) :]) == CATEGORIES
    record = StepRecord(0.0, 1, 2, 3, 4, 5, 6, 1, 0, *range(5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.num_seqs = 2
