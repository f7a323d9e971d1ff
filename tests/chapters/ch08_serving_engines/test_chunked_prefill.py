"""Chunked prefill (chapter 8): the scheduler's token budget, the paged cache's chunks, the simulator's
charge, the real engine's tokens, and the budget sweep."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.chunked_prefill import (
    chunked_config,
    chunked_prefill_sweep,
    inter_token_latencies,
)
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import prefill
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.engine import outputs_match_solo, run_engine
from kvlib.serving.placement import BlockCounter, PagedMemory
from kvlib.serving.scheduler import Scheduler, SchedulerConfig
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import Request, TraceSpec, make_trace

MODEL = TinyLlama(
    ModelConfig(
        vocab_size=97, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64, max_seq_len=128
    )
)


def request(req_id, prompt_len, output_len, arrival=0.0):
    return Request(req_id, arrival, tuple(range(1, prompt_len + 1)), output_len)


def chunked(budget, max_num_seqs):
    return SchedulerConfig(
        max_num_seqs=max_num_seqs, enable_chunked_prefill=True, max_num_batched_tokens=budget
    )


def run_plans(scheduler, until=100):
    """Plan and complete steps (token 0 each, clock = step count); returns every plan."""
    plans = []
    for step in range(until):
        if not scheduler.has_work():
            return plans
        plan = scheduler.schedule(float(step))
        plans.append(plan)
        scheduler.memory.mark_computed(plan)
        scheduler.complete(plan, [0] * len(plan.seqs), float(step + 1))
    raise AssertionError("the scheduler did not finish")


def test_a_long_prompt_is_split_over_steps_and_the_rest_of_the_budget_goes_to_the_next():
    # A: 10-token prompt, B: 5 tokens; budget 8 tokens per step
    memory = PagedMemory(BlockCounter(100, 4), 64)
    scheduler = Scheduler(memory, [request(0, 10, 3), request(1, 5, 2)], chunked(8, 2))
    plans = run_plans(scheduler)
    a, b = sorted(scheduler.finished, key=lambda s: s.seq_id)
    # step 1: A's [0:8] (no token); step 2: A's [8:10] then B's [0:5] = 7 tokens, both get a token;
    # step 3: both decode (B done: 2 tokens); step 4: A decodes (3 tokens)
    assert [[(s.seq_id, i, j) for s, i, j in p.chunks] for p in plans] == [
        [(0, 0, 8)],
        [(0, 8, 10), (1, 0, 5)],
        [],
        [],
    ]
    assert [p.num_prefill_tokens for p in plans] == [8, 2 + 5, 0, 0]
    assert [len(p.decodes) for p in plans] == [0, 0, 2, 1]
    assert [len(p.seqs) for p in plans] == [0, 2, 2, 1]  # a partial prefill produces no token
    assert [r.new_tokens for r in scheduler.records] == [0, 2, 2, 1]
    assert (a.first_token_s, a.finish_s, b.first_token_s, b.finish_s) == (2.0, 4.0, 2.0, 3.0)


def test_without_chunks_the_plan_names_no_chunk_ends():
    memory = PagedMemory(BlockCounter(100, 4), 64)
    plans = run_plans(
        Scheduler(memory, [request(0, 10, 3), request(1, 5, 2)], SchedulerConfig(max_num_seqs=2))
    )
    assert plans[0].prefill_ends is None and plans[0].num_prefill_tokens == 15
    assert [len(p.seqs) for p in plans] == [2, 2, 1]


def test_the_simulator_charges_the_tokens_each_step_computes():
    model = StepTimeModel(1.0, 0.0, 0.0, 1.0)  # 1 s per step + 1 s per prompt token computed
    requests = [request(0, 10, 3), request(1, 5, 2)]
    on = simulate(requests, "paged", 400, model, 64, block_size=4, config=chunked(8, 2))
    off = simulate(requests, "paged", 400, model, 64, block_size=4, config=SchedulerConfig(max_num_seqs=2))
    assert on.steps["duration_s"].tolist() == [1 + 8, 1 + 7, 1, 1]
    assert off.steps["duration_s"].tolist() == [1 + 15, 1, 1]
    assert on.steps["prefill_tokens"].sum() == off.steps["prefill_tokens"].sum() == 15


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 6), st.integers(0, 3)), min_size=1, max_size=10),
    st.integers(4, 24),
)
def test_budget_never_exceeded_decodes_first_and_first_come_first_served(shapes, budget):
    requests = [request(i, p, o, arrival=float(t)) for i, (p, o, t) in enumerate(shapes)]
    memory = PagedMemory(BlockCounter(200, 4), 64)  # ample: nobody is preempted
    scheduler = Scheduler(memory, requests, chunked(budget, 4))
    progress, admitted = {}, []
    for step in range(500):
        if not scheduler.has_work():
            break
        ready = [s for s in scheduler.running if s.seq_id not in scheduler.prefilling]
        plan = scheduler.schedule(float(step))
        assert plan.num_prefill_tokens + len(plan.decodes) <= budget
        assert set(plan.decodes) >= set(ready)  # every prefilled running request decodes at every step
        for seq, start, end in plan.chunks:
            if start == 0:
                admitted.append(seq.seq_id)
            assert start == progress.get(seq.seq_id, 0) and end > start  # chunks follow each other
            progress[seq.seq_id] = end
        memory.mark_computed(plan)
        scheduler.complete(plan, [0] * len(plan.seqs), float(step + 1))
    assert not scheduler.has_work() and scheduler.num_preemptions == 0
    order = sorted(requests, key=lambda r: (r.arrival_s, r.req_id))
    assert admitted == [r.req_id for r in order]  # admitted in arrival order
    firsts = [next(s for s in scheduler.finished if s.seq_id == r.req_id).first_token_s for r in order]
    assert firsts == sorted(firsts)  # and their first tokens come in that order
    assert all(progress[r.req_id] == r.prompt_len for r in requests)  # each prompt computed once


def test_chunked_prefill_settings_are_checked():
    with pytest.raises(KVLibError, match="needs enable_chunked_prefill"):
        SchedulerConfig(max_num_batched_tokens=512)
    with pytest.raises(KVLibError, match="must be >= max_num_seqs"):
        SchedulerConfig(enable_chunked_prefill=True, max_num_batched_tokens=128)  # 256 sequences
    with pytest.raises(KVLibError, match="True or False"):
        SchedulerConfig(enable_chunked_prefill=1)
    with pytest.raises(KVLibError, match="max_num_batched_tokens"):
        SchedulerConfig(enable_chunked_prefill=True, max_num_batched_tokens=0)
    assert SchedulerConfig(enable_chunked_prefill=True).token_budget == 2048  # max_prefill_tokens's


def test_a_prompt_prefilled_in_chunks_gives_the_logits_of_one_pass():
    prompt = list(range(3, 40))  # 37 tokens
    whole, parts = PagedKVCache.for_model(MODEL, 16, 4), PagedKVCache.for_model(MODEL, 16, 4)
    for cache in (whole, parts):
        cache.manager.allocate(0, prompt)
    expected = prefill(MODEL, whole, 0, prompt, 0)
    for start, end in ((0, 10), (10, 11), (11, 30)):  # a one-token chunk runs the decode kernel
        prefill(MODEL, parts, 0, prompt, start, end)
        assert parts.manager.num_computed(0) == end
    got = prefill(MODEL, parts, 0, prompt, 30, 37)
    assert torch.allclose(got, expected, atol=1e-5)
    with pytest.raises(KVLibError, match="outside"):
        prefill(MODEL, parts, 0, prompt, 37, 40)
    other = PagedKVCache.for_model(MODEL, 16, 4)
    other.manager.allocate(0, prompt)
    with pytest.raises(KVLibError, match="starts at 5"):
        prefill(MODEL, other, 0, prompt, 5, 10)  # no K/V for tokens 0..4


def test_the_engine_generates_the_same_tokens_with_chunks_under_preemption():
    requests = make_trace(
        TraceSpec("long prompts", 20, 16, sigma=0.5, max_len=64), 8, math.inf, seed=5, vocab_size=97
    )
    off = run_engine(MODEL, requests, "paged", 96, 64, block_size=4, config=SchedulerConfig(max_num_seqs=4))
    on = run_engine(MODEL, requests, "paged", 96, 64, block_size=4, config=chunked(6, 4), progress=False)
    assert on.num_preemptions >= 1 and on.steps["prefill_tokens"].max() <= 6
    assert (on.steps["new_tokens"] < on.steps["num_seqs"]).any()  # some steps computed partial prefills
    assert [s.generated for s in on.finished] == [s.generated for s in off.finished]
    assert outputs_match_solo(MODEL, on)


def test_inter_token_latencies_repeat_each_step_once_per_decode():
    model = StepTimeModel(1.0, 0.0, 0.0, 1.0)
    run = simulate(
        [request(0, 10, 3), request(1, 5, 2)], "paged", 400, model, 64, block_size=4, config=chunked(8, 2)
    )
    # steps of 9, 8, 1, 1 s decode 0, 0, 2 and 1 sequences
    assert inter_token_latencies(run).tolist() == [1.0, 1.0, 1.0]


def test_the_sweep_has_one_row_per_budget_no_chunks_first():
    model = StepTimeModel(0.01, 0.0, 0.0, 1e-4)
    spec = TraceSpec("sweep", 100, 20, max_len=512)
    rows = chunked_prefill_sweep(
        (None, 8, 64),
        rate=20.0,
        num_requests=30,
        spec=spec,
        step_model=model,
        num_slots=4096,
        max_num_seqs=8,
        progress=False,
    )
    assert [r["budget"] for r in rows] == ["off", 8, 64]
    assert rows[1]["max_step_s"] <= 0.01 + 8 * 1e-4 + 1e-12  # no step computes more than 8 prompt tokens
    assert rows[0]["max_step_s"] > rows[1]["max_step_s"]
    assert rows[1]["ttft_p99_s"] > rows[0]["ttft_p99_s"]  # prompts of ~100 tokens take ~13 steps of 8
    with pytest.raises(KVLibError, match="must be >= max_num_seqs"):
        chunked_config(4, max_num_seqs=8)
    with pytest.raises(KVLibError, match="at least one budget"):
        chunked_prefill_sweep((), progress=False)


def test_every_policy_generates_the_solo_tokens_with_chunks():
    requests = make_trace(
        TraceSpec("long prompts", 20, 16, sigma=0.5, max_len=64), 6, math.inf, seed=5, vocab_size=97
    )
    for policy in ("max", "pow2", "oracle", "paged"):
        run = run_engine(MODEL, requests, policy, 256, 64, block_size=4, config=chunked(6, 4), progress=False)
        assert outputs_match_solo(MODEL, run), policy


def test_with_prefix_caching_a_chunk_publishes_only_computed_blocks():
    # 12 requests share a 32-token system prompt; chunks of 8 tokens: the first request's chunks are
    # published block by block as they are computed, so later ones find them
    spec = TraceSpec("shared", 40, 8, sigma=0.5, max_len=128)
    requests = make_trace(spec, 12, math.inf, seed=5, vocab_size=97, system_prompt=list(range(1, 33)))
    model = StepTimeModel(1.0, 0.0, 0.0, 1.0)
    runs = [
        simulate(
            requests, "paged", 2048, model, 128, block_size=4, config=chunked(8, 4), enable_prefix_caching=c
        )
        for c in (False, True)
    ]
    assert runs[0].steps["prefill_tokens"].sum() == sum(r.prompt_len for r in requests)
    # each of the 11 later requests finds at least the system prompt's 8 blocks of 4
    assert runs[1].steps["prefill_tokens"].sum() <= sum(r.prompt_len for r in requests) - 11 * 32
