"""Placement policies (kvlib.serving.placement), the FCFS continuous-batching scheduler with
preemption (kvlib.serving.scheduler) and the simulator with its step-time model
(kvlib.serving.simulator, kvlib.serving.step_time)."""

import math
import random
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.paged.block_manager import BlockManager
from kvlib.serving.allocators import BuddyAllocator, ContiguousAllocator
from kvlib.serving.placement import (
    POLICIES,
    BlockCounter,
    PagedMemory,
    ReservedMemory,
    make_memory,
    reservation_slots,
)
from kvlib.serving.scheduler import Scheduler, SchedulerConfig
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel, fit_step_time
from kvlib.serving.traces import SHAREGPT, Request, TraceSpec, make_trace
from kvlib.serving.types import CATEGORIES, SeqState, StepRecord

UNIT = StepTimeModel(1.0, 0.0, 0.0, 0.0)


def request(req_id, prompt_len, output_len, arrival=0.0):
    return Request(req_id, arrival, tuple(range(prompt_len)), output_len)


# --------------------------------------------------------------------------- placement


def test_reservations_of_each_policy():
    r = request(0, 300, 300)
    assert [reservation_slots(p, r, 2048) for p in ("max", "pow2", "oracle")] == [2048, 300 + 512, 600]
    assert (
        reservation_slots("pow2", request(0, 40, 25), 2048) == 40 + 32
    )  # the paper's example: 25 output tokens get 32
    assert (
        reservation_slots("pow2", request(0, 100, 256), 2048) == 356
    )  # an exact power of two is not doubled
    assert (
        reservation_slots("pow2", request(0, 1500, 540), 2048) == 2048
    )  # 1,500 + 1,024, capped at the maximum length
    with pytest.raises(KVLibError, match="unknown reservation policy"):
        reservation_slots("paged", r, 2048)


def test_first_fit_places_in_the_first_gap_and_merges_on_free():
    alloc = ContiguousAllocator(100)
    a, b, c = alloc.allocate(30), alloc.allocate(30), alloc.allocate(30)
    assert (a, b, c) == (0, 30, 60) and alloc.allocate(20) is None and alloc.num_free == 10
    alloc.free(a, 30)
    assert alloc.allocate(20) == 0  # first fit: the gap at the front
    alloc.free(b, 30)  # merges with the 10 free slots before it
    assert alloc.gaps == [(20, 40), (90, 10)] and alloc.largest_gap == 40
    alloc.free(0, 20)
    alloc.free(c, 30)
    assert alloc.gaps == [(0, 100)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), min_size=1, max_size=60))
def test_allocator_never_overlaps_and_keeps_gaps_merged(ops):
    alloc, placed = ContiguousAllocator(200), []
    for is_alloc, size in ops:
        if is_alloc or not placed:
            start = alloc.allocate(size)
            if start is not None:
                placed.append((start, size))
        else:
            alloc.free(*placed.pop(size % len(placed)))
        used = sorted(placed)
        assert all(
            s1 + n1 <= s2 for (s1, n1), (s2, _) in zip(used, used[1:], strict=False)
        )  # reservations never overlap
        assert alloc.num_free == 200 - sum(n for _, n in placed)
        assert all(
            s1 + n1 < s2 for (s1, n1), (s2, _) in zip(alloc.gaps, alloc.gaps[1:], strict=False)
        )  # sorted, never adjacent
        for start, size in placed:
            assert all(start + size <= g or g + n <= start for g, n in alloc.gaps)


def test_block_counter_takes_and_frees_the_blocks_a_manager_would():
    rng = random.Random(0)
    manager, counter = BlockManager(40, 4, enable_prefix_caching=False), BlockCounter(40, 4)
    live, next_id, tokens_of = [], 0, {}  # tokens_of: seq_id -> its token list (the caller owns it)
    for _ in range(2000):
        op = rng.random()
        if op < 0.3:
            tokens = [0] * rng.randint(1, 12)
            assert manager.can_allocate(tokens) == counter.can_allocate(tokens)
            assert manager.num_blocks_short(tokens) == counter.num_blocks_short(tokens)
            if (manager.allocate(next_id, tokens) is None) != (counter.allocate(next_id, tokens) is None):
                pytest.fail("allocate disagrees")
            if next_id in manager:
                live.append(next_id)
                tokens_of[next_id] = tokens
            next_id += 1
        elif op < 0.85 and live:
            seq = rng.choice(live)
            if manager.num_tokens(seq) == len(tokens_of[seq]):  # else the last refused token is still due
                tokens_of[seq].append(0)
            assert (manager.append_slot(seq) is None) == (counter.append_slot(seq) is None)
        elif live:
            seq = live.pop(rng.randrange(len(live)))
            manager.free(seq)
            counter.free(seq)
        assert manager.num_free_blocks == counter.num_free_blocks


def seq_state(req):
    return SeqState(req, list(req.prompt))


def test_buddy_blocks_are_powers_of_two_split_in_halves_and_merged_back():
    alloc = BuddyAllocator(24)  # top-level blocks of 16 (at 0) and 8 (at 16)
    assert alloc.footprint(5) == 8 and alloc.footprint(8) == 8 and alloc.footprint(1) == 1
    assert alloc.allocate(5) == 16  # the smallest free block that holds 8 slots: the top-level 8
    assert alloc.allocate(3) == 0  # splits 16 into 8 + 8, then 8 into 4 + 4
    assert alloc.free_blocks[2] == {4} and alloc.free_blocks[3] == {8} and alloc.num_free == 12
    assert alloc.allocate(9) is None and alloc.largest_gap == 8  # 12 slots free, no block of 16
    alloc.free(0, 3)  # merges with its buddy 4, then with 8: the 16 is whole again
    assert alloc.free_blocks[4] == {0} and not alloc.free_blocks[2] and not alloc.free_blocks[3]
    alloc.free(16, 5)  # the two top-level blocks never merge
    assert alloc.num_free == 24 and alloc.largest_gap == 16


@settings(max_examples=60, deadline=None)
@given(st.integers(40, 300), st.lists(st.tuples(st.booleans(), st.integers(1, 40)), min_size=1, max_size=60))
def test_buddy_blocks_never_overlap_and_stay_aligned(num_slots, ops):
    alloc, placed = BuddyAllocator(num_slots), []
    for is_alloc, size in ops:
        if is_alloc or not placed:
            start = alloc.allocate(size)
            if start is not None:
                placed.append((start, alloc.footprint(size), size))
        else:
            start, _, size = placed.pop(size % len(placed))
            alloc.free(start, size)
        used = sorted(placed)
        assert all(s1 + n1 <= s2 for (s1, n1, _), (s2, _, _) in zip(used, used[1:], strict=False))
        assert all(start % block == 0 and start + block <= num_slots for start, block, _ in placed)
        assert alloc.num_free == num_slots - sum(block for _, block, _ in placed)
    for start, _, size in placed:
        alloc.free(start, size)
    assert alloc.num_free == num_slots and alloc.largest_gap == 1 << (
        num_slots.bit_length() - 1
    )  # merged back


def test_the_buddy_allocator_rounds_reservations_into_internal_fragmentation():
    memory = ReservedMemory("oracle", 64, 32)  # buddy by default
    seq = seq_state(request(0, 10, 10))  # 20 true tokens in a block of 32
    assert memory.admit(seq) == 0 and memory.num_reserved == 32
    assert memory.breakdown(10, None) == (10, 10, 12, 0, 32)  # tokens, reserved, internal, external, free
    first_fit = ReservedMemory("oracle", 64, 32, allocator="first-fit")
    first_fit.admit(seq)
    assert first_fit.breakdown(10, None) == (10, 10, 0, 0, 44)
    with pytest.raises(KVLibError, match="unknown allocator"):
        ReservedMemory("oracle", 64, 32, allocator="best-fit")
    with pytest.raises(KVLibError, match="no block"):
        ReservedMemory("max", 48, 48)  # 48 = 32 + 16: no block holds 48 tokens


def test_external_fragmentation_is_free_memory_in_gaps_too_small_for_the_next_request():
    memory = ReservedMemory("oracle", 12, 12, allocator="first-fit")
    seqs = [seq_state(request(i, 2, 2)) for i in range(3)]  # 4 slots each: the budget is full
    for seq in seqs:
        assert memory.admit(seq) == 0
    memory.release(seqs[0])
    memory.release(seqs[2])  # gaps of 4 at both ends, not adjacent
    head = seq_state(request(9, 3, 3))  # needs 6 contiguous slots
    assert memory.admit(head) is None
    held = 3
    tokens, reserved, internal, external, free = memory.breakdown(held, head)
    assert (tokens, reserved, internal, external, free) == (3, 1, 0, 8, 0)
    assert memory.breakdown(held, None)[3:] == (0, 8)  # nobody waits: free, not fragmentation


def test_paged_memory_keeps_a_watermark_and_refuses_budgets_below_one_request():
    memory = PagedMemory(BlockCounter(200, 16), max_len=2048, watermark=0.01)
    assert memory.watermark_blocks == 2
    assert memory.admit(seq_state(request(0, 16 * 197, 1))) is not None  # leaves 3 free
    assert memory.admit(seq_state(request(1, 16, 1))) is not None  # leaves 2 free
    assert memory.admit(seq_state(request(2, 16, 1))) is None  # would leave only 1
    with pytest.raises(KVLibError, match="cannot hold one request"):
        PagedMemory(BlockCounter(100, 16), max_len=2048)
    with pytest.raises(KVLibError, match="cannot hold one request"):
        ReservedMemory("max", 1000, 2048)
    with pytest.raises(KVLibError, match="unknown policy"):
        make_memory("lru", 4096, 2048)


# --------------------------------------------------------------------------- scheduler and simulator


def run_all(requests, policy, num_slots, max_len=2048, **kwargs):
    return simulate(requests, policy, num_slots, UNIT, max_len, **kwargs)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_completes_and_the_budget_is_always_accounted_for(policy):
    requests = make_trace(TraceSpec("t", 30, 60, max_len=256), 80, math.inf, seed=1)
    result = run_all(requests, policy, 1024, max_len=256)
    assert [s.seq_id for s in result.finished] == list(range(80))
    assert all(s.num_generated == s.request.output_len == len(s.generated) for s in result.finished)
    total = sum(result.steps[c] for c in CATEGORIES)
    assert np.all(total == 1024)
    assert set(result.steps) == {f.name for f in fields(StepRecord)} | {"duration_s"}
    if policy != "paged":
        assert result.num_preemptions == 0


def test_first_come_first_served_and_continuous_batching():
    # budget for two max-length requests; the third waits until the first finishes, then joins mid-run
    requests = [request(0, 10, 5), request(1, 10, 50), request(2, 10, 5), request(3, 10, 5)]
    result = run_all(requests, "max", 256, max_len=128)
    finish = {s.seq_id: s.finish_s for s in result.finished}
    first = {s.seq_id: s.first_token_s for s in result.finished}
    assert first[2] > first[0] and first[2] == finish[0] + 1  # admitted at the step after request 0 left
    assert first[2] < finish[1]  # ... while request 1 was still running: continuous batching
    assert first[3] >= first[2]  # never overtakes an earlier request
    assert result.largest_batch == 2


def test_the_youngest_request_is_preempted_and_resumes_first():
    # 6 blocks of 4: three requests of 4-token prompts fit at once but cannot all grow to 12 tokens
    requests = [request(i, 4, 8) for i in range(3)]
    memory = make_memory("paged", 24, 12, block_size=4)
    memory.watermark_blocks = 0
    scheduler = Scheduler(memory, requests)
    while scheduler.has_work():
        plan = scheduler.schedule(0.0)
        memory.mark_computed(plan)
        scheduler.complete(plan, [7] * plan.num_seqs, 0.0)
    counts = {s.seq_id: s.num_preemptions for s in scheduler.finished}
    assert counts[0] == 0 and counts[2] >= 1  # the oldest is never the victim
    # all three hold 2 blocks after 4 generated tokens; the 9th token of each needs a third, and only
    # 6 blocks exist: the youngest (2) is preempted with 5 generated, and its recomputation prefills 4 + 5
    assert scheduler.preempted_generated == [5]
    assert sum(record.prefill_tokens for record in scheduler.records) == 3 * 4 + (4 + 5)
    assert scheduler.held == 0 and not scheduler.running and len(scheduler.finished) == 3
    assert all(s.generated == [7] * 8 for s in scheduler.finished)


def test_step_limits_are_respected():
    requests = [request(i, 100, 3) for i in range(40)]
    result = run_all(
        requests, "paged", 16 * 1000, config=SchedulerConfig(max_num_seqs=8, max_prefill_tokens=250)
    )
    assert result.largest_batch <= 8
    assert result.steps["prefill_tokens"].max() <= 250


def test_utilisation_follows_the_papers_order_on_a_sharegpt_like_trace():
    requests = make_trace(SHAREGPT, 200, math.inf, seed=0)
    shares = {p: run_all(requests, p, 987 * 16).utilisation for p in POLICIES}
    assert shares["max"] < shares["pow2"] < shares["oracle"] < shares["paged"]
    assert shares["paged"] > 0.9


def test_retiming_a_saturated_run_equals_simulating_with_the_new_model():
    requests = make_trace(TraceSpec("t", 40, 80, max_len=512), 60, math.inf, seed=2)
    model = StepTimeModel(0.004, 2e-5, 3e-7, 5e-5)
    for policy in ("oracle", "paged"):
        fresh = simulate(requests, policy, 4096, model, 512)
        retimed = simulate(requests, policy, 4096, UNIT, 512).retimed(model)
        assert retimed.makespan_s == pytest.approx(fresh.makespan_s)
        assert retimed.requests_per_s == pytest.approx(fresh.requests_per_s)
        assert retimed.normalized_latency == pytest.approx(fresh.normalized_latency)
    with pytest.raises(KVLibError, match="arrived at time 0"):
        simulate(make_trace(SHAREGPT, 5, 1.0), "max", 4096, UNIT).retimed(model)


def test_a_lone_request_takes_one_prefill_and_one_step_per_further_token():
    model = StepTimeModel(0.01, 0.001, 1e-5, 1e-4)
    result = simulate([request(0, 20, 5)], "paged", 256, model, 64)
    prefill = 0.01 + 0.001 + 20 * 1e-4
    decodes = sum(0.01 + 0.001 + 1e-5 * (21 + k) for k in range(4))
    assert result.finished[0].finish_s == pytest.approx(prefill + decodes)
    assert result.normalized_latency == pytest.approx((prefill + decodes) / 5)


def test_simulate_rejects_requests_longer_than_max_len():
    with pytest.raises(KVLibError, match="exceeds max_len"):
        simulate([request(0, 100, 100)], "paged", 4096, UNIT, max_len=128)


def test_step_time_fit_recovers_known_constants_and_drops_negative_terms():
    rng = np.random.default_rng(0)
    n, ctx, pre = rng.integers(1, 64, 30), rng.integers(0, 16000, 30), rng.integers(0, 512, 30)
    seconds = 0.003 + 2e-5 * n + 2e-7 * ctx + 3e-5 * pre
    fit = fit_step_time(n, ctx, pre, seconds)
    assert (fit.fixed_s, fit.per_seq_s, fit.per_context_s, fit.per_prefill_s) == pytest.approx(
        (0.003, 2e-5, 2e-7, 3e-5), rel=1e-6
    )
    shrinking = (
        0.003 - 1e-6 * n + 2e-7 * ctx + 3e-5 * pre + 2e-5
    )  # "faster with more sequences": no such thing
    assert fit_step_time(n, ctx, pre, shrinking).per_seq_s == 0
    with pytest.raises(KVLibError, match="at least 4"):
        fit_step_time([1, 2], [0, 0], [0, 0], [0.1, 0.2])
    assert StepTimeModel(0.003, 0.0, 1e-7, 0.0).fixed_share(10, 30_000) == pytest.approx(0.5)


def test_blocks_short_counts_prefix_cache_hits():
    manager = BlockManager(num_blocks=10, block_size=4)
    manager.allocate(0, list(range(12)))  # 3 blocks
    manager.mark_computed(0)
    assert (
        manager.num_blocks_short(list(range(12)) + [50, 51]) == 1 - 7
    )  # 3 cached blocks hit: 1 new block of 7 free
    assert manager.num_blocks_short([99] * 40) == 10 - 7
    memory = PagedMemory(manager, max_len=16, watermark=0.0)
    assert memory.admit(seq_state(request(1, 14, 1))) == 12  # its prompt is range(14): three cached blocks


def test_prefix_caching_stores_a_shared_system_prompt_once():
    system = tuple(range(64))  # 4 blocks of 16 in front of every prompt
    requests = make_trace(TraceSpec("short", 8, 8, max_len=256), 40, math.inf, seed=1, system_prompt=system)
    runs = {
        caching: simulate(requests, "paged", 512, UNIT, 256, enable_prefix_caching=caching)
        for caching in (False, True)
    }
    assert runs[False].stored_per_held == pytest.approx(1.0, abs=0.02)  # unshared: every held token is stored
    assert runs[True].stored_per_held < 0.5  # the 64 shared tokens are stored once, not once per request


# --------------------------------------------------------------------------- preemption policies


def _outcome(result):
    return [(s.seq_id, s.num_preemptions, s.finish_s, s.first_token_s) for s in result.finished]


def test_without_a_victim_policy_the_youngest_is_preempted_and_every_output_is_unchanged():
    """The hook's default is the FCFS rule: a policy that returns the last candidate changes nothing."""
    requests = make_trace(TraceSpec("t", 30, 60, max_len=256), 60, math.inf, seed=1)
    default = run_all(requests, "paged", 1024, max_len=256)
    youngest = run_all(requests, "paged", 1024, max_len=256, victim=lambda running: running[-1])
    assert default.num_preemptions > 10
    assert _outcome(default) == _outcome(youngest)
    assert default.preempted_generated.tolist() == youngest.preempted_generated.tolist()
    for name in default.steps:
        assert np.array_equal(default.steps[name], youngest.steps[name]), name


def test_a_victim_policy_chooses_among_the_asker_and_the_younger_running_requests():
    requests = [request(i, 4, 8) for i in range(3)]
    memory = make_memory("paged", 24, 12, block_size=4)
    memory.watermark_blocks = 0
    offered = []

    def oldest(running):
        offered.append((running, list(scheduler.running)))
        return running[0]

    scheduler = Scheduler(memory, requests, victim=oldest)
    while scheduler.has_work():
        plan = scheduler.schedule(0.0)
        memory.mark_computed(plan)
        scheduler.complete(plan, [7] * plan.num_seqs, 0.0)
    assert offered
    for candidates, running in offered:
        # a tuple, a suffix of the running list, oldest first: those older than the asker have their slot
        assert isinstance(candidates, tuple) and list(candidates) == running[len(running) - len(candidates) :]
    counts = {s.seq_id: s.num_preemptions for s in scheduler.finished}
    # the same memory as test_the_youngest_request_is_preempted_and_resumes_first: when request 0 asks
    # for its third block, it is the first candidate, and this policy preempts it, not request 2
    assert counts[0] >= 1
    assert scheduler.held == 0 and len(scheduler.finished) == 3
    assert all(s.generated == [7] * 8 for s in scheduler.finished)


@pytest.mark.parametrize("seed", range(4))
def test_every_request_completes_whichever_request_a_policy_preempts(seed):
    chooser = random.Random(seed)
    requests = make_trace(TraceSpec("t", 30, 60, max_len=256), 50, math.inf, seed=seed)
    result = run_all(requests, "paged", 768, max_len=256, victim=lambda running: chooser.choice(running))
    assert result.num_preemptions > 0
    assert sorted(s.seq_id for s in result.finished) == list(range(50))
    assert all(s.num_generated == s.request.output_len for s in result.finished)
    assert np.all(sum(result.steps[c] for c in CATEGORIES) == 768)


def test_a_victim_policy_that_returns_no_running_request_or_is_no_function_is_refused():
    requests = make_trace(TraceSpec("t", 30, 60, max_len=256), 40, math.inf, seed=2)
    with pytest.raises(KVLibError, match=r"victim policy returned \d+ \(int\), not one of the \d+ running"):
        run_all(requests, "paged", 1024, max_len=256, victim=lambda running: len(running))
    with pytest.raises(KVLibError, match="victim must be a function"):
        run_all(requests, "paged", 1024, max_len=256, victim="longest")
