"""Chapter 11's experiments: the seeded traces' shapes, the small cases worked by hand, the hit rates'
order at equal capacity, the engine's tokens through the tree, the router's rules and the simulated
routing runs, and the bench's fields."""

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.chapters.ch11_radix_routing import hit_rates, routing, traces
from kvlib.chapters.ch11_radix_routing.bench import bench
from kvlib.chapters.ch12_offload_tier.returning import cpu_model


def test_the_traces_are_seeded_and_each_turn_extends_its_conversation():
    assert traces.multi_turn_trace() == traces.multi_turn_trace()
    convs = traces.conversations(3, 4)
    for turns in convs:
        for before, after in zip(turns, turns[1:], strict=False):
            assert after.prompt[: len(before.prompt) + len(before.answer)] == before.prompt + before.answer
    assert all(
        t.prompt[: traces.SYSTEM_LEN] == convs[0][0].prompt[: traces.SYSTEM_LEN] for c in convs for t in c
    )
    trace = traces.multi_turn_trace(3, 4)
    for c in range(3):  # interleaved, each conversation's turns in order
        assert [t.index for t in trace if t.conversation == c] == [0, 1, 2, 3]
    assert {t.conversation for t in traces.few_shot_trace(20)} <= set(range(traces.NUM_TASKS))


def test_small_cases_worked_by_hand():
    rows = {r["case"]: r for r in hit_rates.small_cases()}
    hashed, pages16, pages1 = hit_rates.CACHES
    aligned, branch, partial = rows.values()
    assert aligned[hashed] == aligned[pages16] == aligned[pages1] == 64
    assert (branch[hashed], branch[pages16], branch[pages1]) == (32, 32, 40)  # 2 whole blocks; 40 tokens
    # the first turn's K/V: 50 + 10 of its 11 answer tokens = 60; whole blocks: 48
    assert (partial[hashed], partial[pages16], partial[pages1]) == (48, 48, 60)


def test_with_ample_slots_pages_of_a_block_hit_exactly_as_the_hash_cache():
    hashed, pages16, pages1 = hit_rates.CACHES
    for trace in (traces.multi_turn_trace(), traces.few_shot_trace()):
        (row,) = hit_rates.hit_rate_rows(trace, (32768,))
        assert row[hashed] == row[pages16] < row[pages1]
        small, big = hit_rates.hit_rate_rows(trace, (1024, 32768))
        assert all(small[kind] < big[kind] for kind in hit_rates.CACHES)


def test_replay_refuses_a_cache_too_small_for_a_prompt():
    with pytest.raises(KVLibError, match="cannot hold"):
        hit_rates.replay(hit_rates.make_manager(hit_rates.CACHES[0], 64), traces.multi_turn_trace(2, 1))
    with pytest.raises(KVLibError, match="cache must be one of"):
        hit_rates.make_manager("lru", 1024)


@pytest.mark.parametrize("block_size", [16, 1])
def test_the_engine_model_generates_the_same_tokens_through_the_tree(block_size):
    run = hit_rates.engine_conversations(cpu_model(), block_size)
    assert run.tokens_identical and run.num_hit_tokens > 0 and run.num_evicted_tokens > 0


def test_the_router_rules():
    rr = routing.Router("round-robin", 3, 100)
    assert [rr.route((1, 2)) for _ in range(4)] == [0, 1, 2, 0]
    ll = routing.Router("least-loaded", 2, 100)
    assert [ll.route((1,)) for _ in range(3)] == [0, 1, 0]
    ll.finished(0)
    ll.finished(0)
    assert ll.route((1,)) == 0
    aware = routing.Router("prefix-aware", 2, 100, routing.RouterConfig(balance_abs_threshold=0))
    assert aware.route(tuple(range(10))) == 0  # empty trees: the smallest tree, the first
    assert aware.route(tuple(range(100, 110))) == 1  # loads (1, 0): the load rule fires
    assert aware.route(tuple(range(10)) + (60,)) == 0  # loads (1, 1): 10 of 11 tokens match replica 0
    assert aware.route(tuple(range(100, 110)) + (7,)) == 1  # loads (2, 1): the load rule again
    assert (aware.num_balanced, aware.num_cache_routed) == (2, 1)
    with pytest.raises(KVLibError, match="policy must be one of"):
        routing.Router("random", 2, 100)


def test_a_small_routing_run_serves_every_turn():
    convs = traces.conversations(12, 3)
    runs = {p: routing.simulate_routing(p, convs, num_replicas=2) for p in routing.ROUTING_POLICIES}
    for run in runs.values():
        assert len(run.ttft_s) == 36 and sum(run.turns_per_replica) == 36 and np.all(run.ttft_s > 0)
        assert 0 < run.hit_rate < 1
    assert runs["round-robin"].turns_per_replica == (18, 18)
    assert runs["prefix-aware"].hit_rate > runs["round-robin"].hit_rate


def test_one_replica_with_each_prefix_cache():
    rows = {r["prefix cache"]: r for r in routing.one_replica_rows(num_conversations=8)}
    assert rows["none"]["hit rate"] == 0 and rows["radix"]["hit rate"] == rows["hash"]["hit rate"] > 0
    assert rows["radix"]["p99 TTFT (s)"] < rows["none"]["p99 TTFT (s)"]
    with pytest.raises(KVLibError, match="cache must be one of"):
        routing.Replica(1024, "lru")


def test_bench_fields():
    fields = bench()
    assert fields["radix_tokens_identical"] is True
    assert fields["radix_prefix_hit_rate"] > fields["hash_prefix_hit_rate"] > 0
    assert fields["routing_cache_aware_hit_ratio"] > 1 and fields["routing_p99_ttft_ratio"] > 0
    assert fields["radix_one_replica_tokens_per_s_ratio"] > 1
