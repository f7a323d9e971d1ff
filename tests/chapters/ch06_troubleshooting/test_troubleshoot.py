"""kvlib.chapters.ch06_troubleshooting.troubleshoot: a byte budget buys the blocks it should, the block
manager refuses the batch
that does not fit (recorded, not raised), the request-count planner rounds to blocks or
reserves the maximum length exactly, and section 2's growth bounds and checks follow the
arithmetic derived by hand, the probe's samples paired with the steps' round by round."""

import statistics

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import kv_bytes_per_token
from kvlib.chapters.ch02_cache_size.decode_roofline import DecodeMeasurement
from kvlib.chapters.ch02_cache_size.decode_speed import DecodeSetup
from kvlib.chapters.ch06_troubleshooting.troubleshoot import (
    TINY_CONTEXT,
    BatchOutcome,
    GrowthRun,
    batch_sweep,
    block_bytes,
    growth_bounds,
    growth_checks,
    measure_growth,
    requests_that_fit,
)
from kvlib.measure.probes import Bandwidth
from kvlib.measure.timing import Timing
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.sizing.capacity import max_batch
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import bytes_per_token
from kvlib.units import GiB

SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, d_ff=96, max_seq_len=256)


def prompts_of(count, length, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 97, (length,), generator=gen).tolist() for _ in range(count)]


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_block_bytes_equals_the_pool_of_a_paged_cache(num_kv_heads, block_size):
    model = TinyLlama(ModelConfig(**{**SMALL, "num_kv_heads": num_kv_heads}))
    cache = PagedKVCache(model.config, num_blocks=3, block_size=block_size)
    assert block_bytes(model, block_size) == cache.bytes_per_block


def test_sweep_runs_up_to_the_budget_and_refuses_one_more_request():
    model = TinyLlama(ModelConfig(**SMALL))
    # 6-token prompts + 6 new tokens: 11 tokens stored = 3 blocks of 4; the budget buys 10 blocks
    budget = 10 * block_bytes(model, 4) + block_bytes(model, 4) - 1
    outcomes = batch_sweep(model, prompts_of(5, 6), 6, budget, batches=[1, 3, 4, 5], block_size=4)
    assert [o.batch for o in outcomes] == [1, 3, 4, 5]
    assert all(o.num_blocks == 10 for o in outcomes)
    assert [o.ran for o in outcomes] == [True, True, False, False]
    assert all(o.pool_bytes == 10 * block_bytes(model, 4) <= budget for o in outcomes if o.ran)
    assert all(o.pool_bytes is None for o in outcomes if not o.ran)
    # 4 prompts need 8 blocks and start; the sequences run out when they grow into their third block
    assert "full after" in outcomes[2].error and "10 blocks" in outcomes[2].error
    assert outcomes[2].row()["outcome"].startswith("refused: the cache of 10 blocks")
    assert outcomes[0].row()["outcome"] == f"ran in a pool of {10 * block_bytes(model, 4):,} bytes"


def test_sweep_refuses_at_prefill_when_the_prompts_alone_do_not_fit():
    model = TinyLlama(ModelConfig(**SMALL))
    outcome = batch_sweep(model, prompts_of(3, 9), 2, 5 * block_bytes(model, 4), batches=[3], block_size=4)[0]
    assert not outcome.ran and "cannot hold prompt 1" in outcome.error


def test_sweep_agrees_with_the_planner():
    model = TinyLlama(ModelConfig(**{**SMALL, "num_kv_heads": 2}))
    budget = 12 * block_bytes(model, 4)
    most = requests_that_fit([7] * 8, budget, kv_bytes_per_token(model.config), 4)
    assert most == 6
    at_most, one_more = batch_sweep(
        model, prompts_of(8, 3), 5, budget, batches=[most, most + 1], block_size=4
    )
    assert at_most.ran and not one_more.ran


@pytest.mark.parametrize(
    "budget, batches, match",
    [
        (10, [1], "holds no block"),
        (10**6, [0], "between 1 and"),
        (10**6, [4], "between 1 and"),
        (10**6, [], "between 1 and"),
    ],
)
def test_sweep_rejects_bad_input(budget, batches, match):
    model = TinyLlama(ModelConfig(**SMALL))
    with pytest.raises(KVLibError, match=match):
        batch_sweep(model, prompts_of(3, 4), 2, budget, batches=batches, block_size=4)


def test_outcome_rows_name_the_refusal():
    assert BatchOutcome(3, 8, None, "out of blocks").row() == {
        "batch": 3,
        "blocks in budget": 8,
        "outcome": "refused: out of blocks",
    }


@pytest.mark.parametrize(
    "free, expected",
    [(15, 0), (16, 1), (31, 1), (32, 2), (63, 2), (64, 3), (10**9, 3)],
)
def test_paged_requests_hold_whole_blocks(free, expected):
    # lengths 1, 16, 17 take 16, 16 and 32 slots of one byte each
    assert requests_that_fit([1, 16, 17], free, 1, block_size=16) == expected


def test_exact_lengths_and_reservations():
    assert requests_that_fit([1, 16, 17], 33, 1, block_size=None) == 2  # 1 + 16 + 17 = 34 > 33
    assert requests_that_fit([1, 16, 17], 34, 1, block_size=None) == 3
    assert requests_that_fit([1, 16, 17], 99, 1, reserve=32) == 3
    assert requests_that_fit([1, 16, 17], 95, 1, reserve=32) == 2
    assert requests_that_fit([5, 5], 100, 10, block_size=4) == 1  # 8 slots x 10 bytes each
    assert requests_that_fit([], 100, 1) == 0


def test_reservation_matches_max_batch_for_a_real_model():
    spec = catalog_entry("Llama-2-7B").spec
    free = 63 * GiB + 12345
    expected = max_batch(spec, 4096, free, 0)
    assert requests_that_fit([100] * 200, free, bytes_per_token(spec), reserve=4096) == expected == 31


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lengths=[1], free_bytes=-1, bytes_per_token=1), "free_bytes"),
        (dict(lengths=[1], free_bytes=10, bytes_per_token=0), "bytes_per_token"),
        (dict(lengths=[0], free_bytes=10, bytes_per_token=1), "positive"),
        (dict(lengths=[40], free_bytes=10, bytes_per_token=1, reserve=32), "reservation"),
    ],
)
def test_planner_rejects_bad_input(kwargs, match):
    with pytest.raises(KVLibError, match=match):
        requests_that_fit(**kwargs)


# ---- section 2: how a decode step may grow with its cache


def test_growth_bounds_by_hand():
    # 4x the bytes, LLC 1/16 of the long step and 1/4 of the short one
    lower, upper = growth_bounds(short_bytes=4 << 20, long_bytes=16 << 20, llc=1 << 20)
    assert lower == pytest.approx(4 * (1 - 1 / 16))  # the long step pays DRAM for 15/16 of its bytes
    assert upper == pytest.approx(4 / (1 - 1 / 4))  # the short one at least for 3/4 of its bytes
    # a short step that fits in the cache has no upper bound: the cache may be much faster
    assert growth_bounds(1 << 20, 16 << 20, 1 << 20) == (pytest.approx(16 * 15 / 16), None)
    # a long step that fits in the cache has no lower bound beyond zero
    assert growth_bounds(1 << 10, 1 << 12, 1 << 20)[0] == 0.0
    with pytest.raises(KVLibError, match="short_bytes < long_bytes"):
        growth_bounds(16, 16, 1)


def _timing(*samples):
    return Timing(statistics.median(samples), min(samples), max(samples), tuple(samples))


def _growth_run(times_by_context, llc, gqa=None, mqa=None, probe=None):
    setup = DecodeSetup(torch.device("cpu"), torch.float32, batch=1, contexts=(1024, 4096, 16384), threads=1)
    step = lambda kv, n, samples: DecodeMeasurement("grouped", kv, n, 1, 32, 128, 4, _timing(*samples))  # noqa: E731
    rounds = len(next(iter(times_by_context.values())))
    gqa, mqa = gqa or (1.0,) * rounds, mqa or (0.5,) * rounds
    steps = [step(32, n, s) for n, s in times_by_context.items()] + [step(8, 16384, gqa), step(1, 16384, mqa)]
    probe = Bandwidth("cpu", 1 << 30, _timing(*(probe or (0.1,) * rounds)), threads=1)  # 1 GiB: 10.7 GB/s
    return GrowthRun(setup, llc, probe, tuple(steps))


def test_growth_checks_compare_within_rounds():
    # each context costs 1 ms per 1,024 tokens plus 0.1 ms; round 2 runs everything 3x slower (load)
    times = {
        n: [(0.1 + n / 1024) * 1e-3 * f for f in (1, 3, 1)] for n in (TINY_CONTEXT, 1024, 4096, 8192, 16384)
    }
    llc = 32 << 20  # MHA's K+V is 32 KiB per token: 1,024 tokens = 1x LLC, 4,096 = 4x
    rows = growth_checks(_growth_run(times, llc))
    assert [(r["from context"], r["x LLC"]) for r in rows] == [(1024, 1.0), (4096, 4.0), (8192, 8.0)]
    by = {r["from context"]: r for r in rows}
    assert by[1024]["upper bound"] is None and by[1024]["lower bound"] == pytest.approx(15)
    assert by[4096]["bytes ratio"] == 4 and by[8192]["bytes ratio"] == 2
    # within a round the 3x load cancels: the ratio is that of the unloaded times
    assert by[4096]["time ratio"] == pytest.approx(16.1 / 4.1)
    tiny = 0.1 + TINY_CONTEXT / 1024
    assert by[4096]["time ratio less fixed cost"] == pytest.approx((16.1 - tiny) / (4.1 - tiny))
    assert (by[4096]["lower bound"], by[4096]["upper bound"]) == growth_bounds(128 << 20, 512 << 20, llc)
    for row in rows:  # a fixed cost plus the same cost per token lies within the bounds
        assert row["lower bound"] <= row["time ratio less fixed cost"]
        assert row["upper bound"] is None or row["time ratio"] <= row["upper bound"]


def test_growth_run_finds_its_steps_and_speedups():
    times = {n: [n * 1e-6, n * 2e-6] for n in (TINY_CONTEXT, 1024, 4096, 8192, 16384)}
    run = _growth_run(times, llc=32 << 20, gqa=(4e-3, 8e-3), mqa=(2e-3, 2e-3))
    assert run.step(32, 4096).context == 4096 and run.step(8, 16384).num_kv_heads == 8
    assert run.speedup(8) == pytest.approx(16384e-6 / 4e-3)  # each round: 16.384 / 4 and 32.768 / 8
    assert run.speedup(1) == pytest.approx(statistics.median([16384e-6 / 2e-3, 32768e-6 / 2e-3]))
    assert run.dram_share(run.step(32, 16384)) == pytest.approx(1 - 1 / 16)
    assert run.dram_share(run.step(1, 16384)) == 0.0  # 16 MiB fits in 32 MiB
    assert [r["x LLC"] for r in run.rows()][:2] == [0.015625, 1.0]
    with pytest.raises(KVLibError, match="no step with 4 KV heads"):
        run.step(4, 16384)


def test_rates_are_compared_with_the_probe_round_by_round():
    # MHA at 16,384 tokens reads 512 MiB; the LLC is 32 MiB, so 480 MiB must come from DRAM.
    # Round 1: the step takes 50 ms and the 1 GiB probe 100 ms; round 2 everything runs 4x
    # slower (load), round 3 only the probe does (a burst): per round the DRAM part is read at
    # 0.9375, 0.9375 and 3.75 times the probe's rate, whose median is 0.9375.
    times = {n: [n * 1e-6] * 3 for n in (TINY_CONTEXT, 1024, 4096, 8192)}
    times[16384] = [0.05, 0.2, 0.05]
    run = _growth_run(times, llc=32 << 20, probe=(0.1, 0.4, 0.4))
    assert run.dram_rate_over_probe(run.step(32, 16384)) == pytest.approx(480 / 512 * 2 * 0.5)
    share = {(r["KV heads"], r["context"]): r["share of probe"] for r in run.rows()}
    assert share[32, 16384] == pytest.approx(512 / 1024 * 2)  # all its bytes, against the probe's, per round
    with pytest.raises(KVLibError, match="fit in the 32 MiB LLC"):
        run.dram_rate_over_probe(run.step(32, 1024))


def test_measure_growth_times_every_step_and_the_probe_on_the_setups_threads():
    setup = DecodeSetup(
        torch.device("cpu"),
        torch.float32,
        batch=1,
        contexts=(64, 256, 1024),
        num_heads=8,
        head_dim=8,
        threads=1,
    )
    threads = torch.get_num_threads()
    run = measure_growth(setup, rounds=2)
    assert torch.get_num_threads() == threads
    assert [(m.num_kv_heads, m.context) for m in run.steps] == [
        (8, TINY_CONTEXT),
        (8, 64),
        (8, 256),
        (8, 512),
        (8, 1024),
        (1, 1024),
    ]  # no GQA-8 with 8 heads
    assert all(len(m.timing.samples) == 2 and m.timing.min_s > 0 for m in run.steps)
    # the probe reads the two buffers of MHA's longest step, in the same two rounds
    assert run.probe.num_bytes == run.step(8, 1024).kv_bytes == 2 * 8 * 1024 * 8 * 4
    assert len(run.probe.timing.samples) == 2 and run.probe.threads == 1 and run.llc_bytes > 0
