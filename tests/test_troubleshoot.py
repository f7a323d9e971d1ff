"""kvlib.troubleshoot: a byte budget buys the blocks it should, the block manager refuses the batch
that does not fit (recorded, not raised), and the request-count planner rounds to blocks or
reserves the maximum length exactly."""

import pytest
import torch

from kvlib import KVLibError, sizing
from kvlib.cache import kv_bytes_per_token
from kvlib.model import ModelConfig, TinyLlama
from kvlib.paged_attention import PagedKVCache
from kvlib.troubleshoot import BatchOutcome, batch_sweep, block_bytes, requests_that_fit

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
    at_most, one_more = batch_sweep(model, prompts_of(8, 3), 5, budget, batches=[most, most + 1], block_size=4)
    assert at_most.ran and not one_more.ran


@pytest.mark.parametrize(
    "budget, batches, match",
    [(10, [1], "holds no block"), (10**6, [0], "between 1 and"), (10**6, [4], "between 1 and"), (10**6, [], "between 1 and")],
)
def test_sweep_rejects_bad_input(budget, batches, match):
    model = TinyLlama(ModelConfig(**SMALL))
    with pytest.raises(KVLibError, match=match):
        batch_sweep(model, prompts_of(3, 4), 2, budget, batches=batches, block_size=4)


def test_outcome_rows_name_the_refusal():
    assert BatchOutcome(3, 8, None, "out of blocks").row() == {"batch": 3, "blocks in budget": 8, "outcome": "refused: out of blocks"}


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
    spec = sizing.catalog_entry("Llama-2-7B").spec
    free = 63 * sizing.GiB + 12345
    expected = sizing.max_batch(spec, 4096, free, 0)
    assert requests_that_fit([100] * 200, free, sizing.bytes_per_token(spec), reserve=4096) == expected == 31


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(lengths=[1], free_bytes=-1, bytes_per_token=1), "free_bytes"),
     (dict(lengths=[1], free_bytes=10, bytes_per_token=0), "bytes_per_token"),
     (dict(lengths=[0], free_bytes=10, bytes_per_token=1), "positive"),
     (dict(lengths=[40], free_bytes=10, bytes_per_token=1, reserve=32), "reservation")],
)
def test_planner_rejects_bad_input(kwargs, match):
    with pytest.raises(KVLibError, match=match):
        requests_that_fit(**kwargs)
