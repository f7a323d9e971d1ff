"""Swapping as the second preemption mode (chapter 8): the host pool, the scheduler's swap queue,
the simulator's transfer time, the real engine's tokens, and the break-even with recomputation."""

import math

import pytest
import torch

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.swap_analysis import (
    a100_swap_model,
    break_even,
    free_prefill_tokens,
    swap_vs_recompute_break_even_tokens,
)
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.engine import outputs_match_solo, run_engine
from kvlib.serving.placement import BlockCounter, PagedMemory
from kvlib.serving.scheduler import Scheduler, SchedulerConfig
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.swap import BlockCopyModel, HostPool, SwapTimeModel
from kvlib.serving.traces import Request, TraceSpec, make_trace

MODEL = TinyLlama(
    ModelConfig(
        vocab_size=97, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64, max_seq_len=128
    )
)
SWAP = SchedulerConfig(preemption_mode="swap", num_host_blocks=8)
UNIT = StepTimeModel(1.0, 0.0, 0.0, 0.0)


def request(req_id, prompt_len, output_len):
    return Request(req_id, 0.0, tuple(range(1, prompt_len + 1)), output_len)


def test_the_host_pool_counts_blocks_and_refuses_what_does_not_fit():
    host = HostPool(5, 4)
    assert host.swap_out(1, 9)  # 3 blocks of 4
    assert host.num_free_blocks == 2 and host.holds(1)
    assert not host.swap_out(2, 9)  # 3 more do not fit: nothing changes
    assert host.num_free_blocks == 2 and not host.holds(2)
    assert host.swap_out(2, 8)  # 2 blocks do
    assert host.swap_in(1) == 9 and host.num_free_blocks == 3
    assert (host.num_swap_outs, host.num_swap_ins) == (2, 1)
    with pytest.raises(KVLibError, match="already swapped out"):
        host.swap_out(2, 1)
    with pytest.raises(KVLibError, match="not swapped out"):
        host.swap_in(1)
    for bad in (0, 1.5, True):
        with pytest.raises(KVLibError, match="num_blocks"):
            HostPool(bad, 4)
    with pytest.raises(KVLibError, match="differs from the cache"):
        HostPool(4, 8, PagedKVCache.for_model(MODEL, 4, 4))
    with pytest.raises(KVLibError, match="tokens to swap out"):
        host.swap_out(3, 0)


def test_swapped_k_and_v_come_back_into_other_blocks_unchanged():
    cache = PagedKVCache.for_model(MODEL, 8, 4, enable_prefix_caching=False)
    tokens = list(range(10))
    cache.manager.allocate(7, tokens)
    cache.k.normal_(), cache.v.normal_()
    cache.manager.mark_computed(7)
    before = [t.clone() for t in cache.read(7, 1)]  # (kv_heads, 10, head_dim) each
    host = HostPool(4, 4, cache)
    assert host.swap_out(7, 10)
    cache.manager.free(7)
    cache.manager.allocate(99, [0] * 12)  # takes the freed blocks first
    cache.k.zero_(), cache.v.zero_()
    cache.manager.allocate(7, tokens)
    assert set(cache.manager.block_table(7)).isdisjoint(cache.manager.block_table(99))
    assert host.swap_in(7) == 10 and cache.manager.num_computed(7) == 10
    after = cache.read(7, 1)
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_a_victim_is_swapped_out_and_back_in_and_falls_back_to_recompute_when_the_host_is_full():
    # 4 blocks of 4, no watermark: A (prompt 7) and B (prompt 7) take 2 blocks each; when B needs a
    # third block (its 9th token), B, the youngest, is preempted
    def run(num_host_blocks):
        config = SchedulerConfig(preemption_mode="swap", num_host_blocks=num_host_blocks)
        memory = PagedMemory(BlockCounter(4, 4), 16, watermark=0.0)
        scheduler = Scheduler(
            memory, [request(0, 7, 5), request(1, 7, 5)], config, HostPool(num_host_blocks, 4)
        )
        for step in range(40):
            if not scheduler.has_work():
                return scheduler
            plan = scheduler.schedule(float(step))
            scheduler.complete(plan, [0] * len(plan.seqs), float(step + 1))
        raise AssertionError("did not finish")

    swapped = run(2)  # B's 8 tokens with slots fill 2 host blocks
    b = next(s for s in swapped.finished if s.seq_id == 1)
    assert (swapped.num_swaps, swapped.num_preemptions, b.num_swaps, b.num_preemptions) == (1, 0, 1, 0)
    # the swap out copies B's 8 tokens with a slot; the swap in the same 8
    assert [r.swapped_tokens for r in swapped.records if r.swapped_tokens] == [8, 8]
    assert swapped.host.num_free_blocks == 2
    recomputed = run(1)  # 8 tokens need 2 host blocks: recomputed instead
    assert (recomputed.num_swaps, recomputed.num_preemptions) == (0, 1)


def test_the_simulator_adds_each_copy_to_its_step():
    requests = [request(0, 7, 5), request(1, 7, 5)]
    swap_model = SwapTimeModel(bytes_per_token=10, bandwidth=100.0, per_transfer_s=0.5)  # 0.5 s + 0.1 s/token
    config = SchedulerConfig(preemption_mode="swap", num_host_blocks=2)
    run = simulate(
        requests, "paged", 16, UNIT, 16, block_size=4, config=config, watermark=0.0, swap_model=swap_model
    )
    plain = simulate(requests, "paged", 16, UNIT, 16, block_size=4, watermark=0.0)
    copies = run.steps["swapped_tokens"]
    assert copies.tolist().count(8) == 2
    # every step 1 s; a step with a copy of 8 tokens also 0.5 + 8 x 0.1 = 1.3 s
    assert run.steps["duration_s"].tolist() == pytest.approx([2.3 if c else 1.0 for c in copies])
    assert plain.num_preemptions == 1 and run.num_preemptions == 0
    with pytest.raises(KVLibError, match="needs a swap_model"):
        simulate(requests, "paged", 16, UNIT, 16, block_size=4, config=config)


def test_swap_settings_are_checked():
    with pytest.raises(KVLibError, match="unknown preemption_mode"):
        SchedulerConfig(preemption_mode="drop")
    with pytest.raises(KVLibError, match="num_host_blocks >= 1"):
        SchedulerConfig(preemption_mode="swap")
    with pytest.raises(KVLibError, match="num_host_blocks"):
        SchedulerConfig(num_host_blocks=-1)
    with pytest.raises(KVLibError, match="needs a HostPool"):
        Scheduler(PagedMemory(BlockCounter(4, 4), 16), [request(0, 3, 2)], SWAP)
    for bad in ({"bandwidth": 0.0}, {"bandwidth": math.nan}, {"per_transfer_s": -1.0}):
        with pytest.raises(KVLibError, match="SwapTimeModel"):
            SwapTimeModel(**({"bytes_per_token": 1, "bandwidth": 1.0} | bad))


def test_the_engine_generates_the_same_tokens_by_swap_recompute_and_alone():
    requests = make_trace(TraceSpec("stress", 12, 24, max_len=64), 12, math.inf, seed=3, vocab_size=97)
    recomputed = run_engine(MODEL, requests, "paged", 64, 64, block_size=4, progress=False)
    swapped = run_engine(MODEL, requests, "paged", 64, 64, block_size=4, config=SWAP, progress=False)
    assert sum(s.num_swaps for s in swapped.finished) >= 5 and recomputed.num_preemptions >= 8
    assert [s.generated for s in swapped.finished] == [s.generated for s in recomputed.finished]
    assert outputs_match_solo(MODEL, swapped)


def test_break_even_of_two_lines_by_hand():
    step = StepTimeModel(0.01, 1e-4, 0.0, 1e-4)  # recompute: 1e-4 + 1e-4 x L
    swap = SwapTimeModel(
        bytes_per_token=1000, bandwidth=1e8, per_transfer_s=1e-3
    )  # each way: 1e-3 + 1e-5 x L
    line = break_even(step, swap)
    assert (line.swap_fixed_s, line.swap_per_token_s) == pytest.approx((2e-3, 2e-5))
    # 1e-4 + 1e-4 L = 2e-3 + 2e-5 L  ->  L = 1.9e-3 / 8e-5 = 23.75
    assert line.crossing_tokens == pytest.approx(23.75)
    assert line.cheaper_for_long == "swap"
    assert line.recompute_s(10) < line.swap_s(10) and line.recompute_s(30) > line.swap_s(30)
    assert line.tie_bandwidth == pytest.approx(2 * 1000 / 1e-4)  # 2e7 bytes/s: equal slopes
    assert break_even(step, SwapTimeModel(1000, 2e7)).crossing_tokens == math.inf  # parallel lines


def test_the_a100_link_moves_opt_13b_tokens_of_800_kb():
    model = a100_swap_model()
    assert model.bytes_per_token == 2 * 40 * 5120 * 2  # K and V, 40 layers, width 5,120, fp16
    assert model.per_transfer_s == pytest.approx(2 * 40 * 5e-6)  # one call per layer for K and for V
    assert model.transfer_s(1000) == pytest.approx(4e-4 + 1000 * 819200 / 25e9)
    assert swap_vs_recompute_break_even_tokens() == pytest.approx(break_even().crossing_tokens)
    with pytest.raises(KVLibError, match="bandwidth"):
        a100_swap_model(bandwidth=0)


def test_a_memory_bound_step_prefills_free_until_its_compute_outlasts_its_reads():
    # memory: 1 + 0.01 x 10 = 1.1 s; the decodes compute 2 x 0.1 = 0.2 s; the slack, 0.9 s, at 0.05 s a token
    step = StepTimeModel(1.0, 0.1, 0.01, 0.05, overlapped=True)
    assert free_prefill_tokens(step, num_seqs=2, context_tokens=10) == pytest.approx(18.0)
    assert free_prefill_tokens(step) == pytest.approx(20.0)  # no decodes: the weights' read alone
    assert free_prefill_tokens(step, num_seqs=20) == 0.0  # the decodes alone are bound by compute
    assert free_prefill_tokens(StepTimeModel(1.0, 0.1, 0.01, 0.05)) == 0.0  # summed: every token adds
    # OPT-13B on the A100: one read of the 26 GB of weights takes the compute of about 200 prompt tokens
    assert free_prefill_tokens() == pytest.approx((2 * 13e9 / 1.555e12) / (2 * 13e9 / 312e12), rel=0.01)
    with pytest.raises(KVLibError, match="num_seqs"):
        free_prefill_tokens(step, num_seqs=-1)


# ---------------------------------------------------------------- chapter 12: copies counted in calls


def test_block_copy_model_counts_calls_per_block_or_per_layer():
    per_block = BlockCopyModel(100, num_layers=3, block_size=4, bandwidth=1e3, per_call_s=0.5)
    gathered = BlockCopyModel(100, num_layers=3, block_size=4, bandwidth=1e3, per_call_s=0.5, per_block=False)
    # 10 tokens: 3 blocks (12 slots copied), 2 x 3 x 3 = 18 calls, or 2 x 3 = 6 gathered
    assert per_block.num_calls(10) == 18 and gathered.num_calls(10) == 6 and gathered.num_calls(0) == 0
    assert per_block.transfer_s(10) == pytest.approx(18 * 0.5 + 12 * 100 / 1e3)
    assert gathered.transfer_s(10) == pytest.approx(6 * 0.5 + 1.2)
    # the lines: per block, the calls are a slope of 2 x 3 x 0.5 / 4 per token; gathered, a fixed 3 s
    assert (per_block.fixed_s, per_block.per_token_s) == (0.0, pytest.approx(0.1 + 0.75))
    assert (gathered.fixed_s, gathered.per_token_s) == (3.0, pytest.approx(0.1))
    assert per_block.transfer_s(12) == pytest.approx(per_block.fixed_s + 12 * per_block.per_token_s)
    assert per_block.effective_bandwidth(12) == pytest.approx(1200 / per_block.transfer_s(12))


@pytest.mark.parametrize(
    "field, value", [("block_size", 0), ("bandwidth", 0.0), ("per_call_s", -1.0), ("per_block", 1)]
)
def test_block_copy_model_refuses_bad_figures(field, value):
    figures = dict(bytes_per_token=8, num_layers=2, block_size=16, bandwidth=1e9, per_call_s=1e-6)
    with pytest.raises(KVLibError, match=field):
        BlockCopyModel(**{**figures, field: value})
