"""A hostile round on kvlib.paged's public edges (issue 28): each bad call is a one-line KVLibError
naming the argument, or a right answer.

Found in the round: PagedKVCache(None) or of a dict was an AttributeError, dtype="float32" a
TypeError from torch, device="cuda:7" on a torch without CUDA an AssertionError, and an integer
dtype built integer pools; schedule(5), schedule of a tensor or a generator were TypeError or
RuntimeError; read(seq, -1) read the last layer unasked and read(seq, 99) was an IndexError.
The rest (block manager, block pool, prepare, attend on both decode paths) held and are kept here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.block_pool import BlockPool
from kvlib.paged.paged_cache import PagedKVCache

CONFIG = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64)


def one_line(call, *words):
    with pytest.raises(KVLibError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and len(message) < 300 and all(w in message for w in words), message


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(config=None), ("config must be a model config", "NoneType")),
        (dict(config={"num_layers": 2}), ("config", "dict")),
        (dict(dtype="float32"), ("dtype", "'float32'")),
        (dict(dtype=torch.int64), ("dtype", "torch.int64")),
        (dict(dtype=torch.bool), ("dtype",)),
        (dict(device="xyz"), ("device", "'xyz'")),
        (dict(device=3.5), ("device",)),
        (dict(enable_prefix_caching="yes"), ("enable_prefix_caching",)),
        (dict(num_blocks=math.nan), ("num_blocks",)),
        (dict(num_blocks=10**12), ("num_blocks",)),
        (dict(block_size=0), ("block_size",)),
    ],
)
def test_the_cache_names_what_it_cannot_be_built_from(kwargs, words):
    args = {"config": CONFIG, "num_blocks": 8, "block_size": 4, **kwargs}
    one_line(lambda: PagedKVCache(**args), *words)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_a_cuda_device_without_cuda_is_one_line():
    one_line(lambda: PagedKVCache(CONFIG, 8, 4, device="cuda:7"), "cannot allocate the K/V pools", "cuda:7")


def scheduled_cache():
    cache = PagedKVCache(CONFIG, 16, 4)
    cache.manager.allocate(0, [1, 2, 3, 4, 5])
    cache.manager.allocate(1, [1, 2])
    return cache


@pytest.mark.parametrize(
    "seq_ids, words",
    [
        (5, ("seq_ids", "int")),
        (None, ("seq_ids",)),
        ("01", ("seq_ids", "str")),
        (torch.tensor([0, 1]), ("seq_ids", "Tensor")),
        ((i for i in (0, 1)), ("seq_ids", "generator")),
        ([], ("at least one sequence",)),
        ([99], ("99",)),
        ([0, 0], ("twice",)),
    ],
)
def test_schedule_names_what_is_no_list_of_sequences(seq_ids, words):
    one_line(lambda: scheduled_cache().schedule(seq_ids), *words)


def test_schedule_takes_a_tuple_and_partial_must_be_a_bool():
    cache = scheduled_cache()
    cache.schedule((0, 1))
    one_line(lambda: cache.schedule([0], partial="x"), "partial")


@pytest.mark.parametrize("num_new", [math.nan, -1, 0, 10**30, "5", torch.tensor(5), 4])
def test_prepare_names_a_count_that_does_not_fit(num_new):
    cache = scheduled_cache()
    cache.schedule([0])
    words = "has 5 tokens without K/V" if type(num_new) is int and num_new in (4, 10**30) else "num_new"
    one_line(lambda: cache.prepare(num_new), words)


def test_prepare_takes_a_numpy_count():
    cache = scheduled_cache()
    cache.schedule([0])
    assert cache.prepare(np.int64(5)).tolist() == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("layer", [-1, 2, 99, 1.5, None, True])
def test_read_names_a_layer_that_does_not_exist(layer):
    one_line(lambda: scheduled_cache().read(0, layer), "layer")


def test_read_of_an_unknown_sequence_is_named():
    one_line(lambda: scheduled_cache().read(99, 0), "99")


def prefill_cache():
    cache = scheduled_cache()
    cache.schedule([0])
    cache.prepare(5)
    return cache


Q, K, V = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)


@pytest.mark.parametrize(
    "layer, q, k, words",
    [
        (2.0, Q, K, ("layer",)),
        (True, Q, K, ("layer",)),
        (0, Q.tolist(), K, ("q must be a 4-d tensor", "list")),
        (0, Q.double(), K, ("q must be torch.float32",)),
        (0, torch.zeros(1, 4, 5, 8, device="meta"), K, ("q must be torch.float32 on cpu",)),
        (0, torch.randn(1, 3, 5, 8), K, ("head",)),
        (0, torch.randn(1, 4, 5, 4), K, ("head_dim",)),
        (0, Q, K.reshape(1, 1, 10, 8), ("k must be",)),
    ],
)
def test_attend_names_what_does_not_fit_the_prepared_pass(layer, q, k, words):
    one_line(lambda: prefill_cache().attend(layer, q, k, V), *words)


@pytest.mark.parametrize(
    "args, words",
    [
        ((math.nan, 4), ("num_blocks",)),
        ((-1, 4), ("num_blocks",)),
        (("8", 4), ("num_blocks",)),
        ((8, math.nan), ("block_size",)),
        ((10**30, 4), ("num_blocks",)),
        ((8, 4, True, 5), ("copy_block",)),
    ],
)
def test_the_block_manager_names_its_bad_options(args, words):
    one_line(lambda: BlockManager(*args), *words)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda m: m.allocate(0, None), ("token",)),
        (lambda m: m.allocate(0, "abc"), ("token",)),
        (lambda m: m.allocate(0, [1.5, 2.0]), ("token",)),
        (lambda m: m.allocate(0, [-1, 2]), ("token",)),
        (lambda m: m.allocate(0, torch.tensor([1, 2])), ("token",)),
        (lambda m: m.allocate([0], [1, 2]), ("sequence id must be hashable",)),
        (lambda m: m.append_slot(42), ("42",)),
        (lambda m: m.mark_computed(1, 10**30), ("cannot mark",)),
        (lambda m: m.mark_computed(1, -1), ("cannot mark -1",)),
        (lambda m: m.accept(1, -1), ("cannot accept -1",)),
        (lambda m: m.accept(1, math.nan), ("accepted",)),
        (lambda m: m.truncate(1, -1), ("cannot keep -1",)),
        (lambda m: m.truncate(1, 99), ("99",)),
        (lambda m: m.truncate(1, 1.5), ("num_tokens",)),
        (lambda m: m.fork(1, 1), ("1",)),
        (lambda m: m.fork(9, 10), ("9",)),
        (lambda m: m.slot(1, -1), ("position",)),
        (lambda m: m.slot(1, 99), ("position",)),
        (lambda m: m.free(77), ("77",)),
        (lambda m: m.num_blocks_for(-1), ("num_tokens",)),
        (lambda m: m.num_blocks_for(math.nan), ("num_tokens",)),
        (lambda m: m.can_allocate(None), ("token",)),
        (lambda m: m.ref_cnt(-1), ("block",)),
    ],
)
def test_block_manager_calls_name_their_bad_arguments(call, words):
    manager = BlockManager(8, 4)
    manager.allocate(1, [1, 2, 3])
    one_line(lambda: call(manager), *words)


def test_a_prompt_too_long_for_the_pool_is_no_allocation():
    assert BlockManager(8, 4).allocate(5, [1] * 10**6) is None


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda p: BlockPool(math.nan), ("num_blocks",)),
        (lambda p: BlockPool(0), ("num_blocks",)),
        (lambda p: p.get_new_blocks(5), ("5",)),
        (lambda p: p.get_new_blocks(-1), ("-1",)),
        (lambda p: p.free_blocks([0, 1]), ("block",)),
        (lambda p: p.free_blocks("ab"), ("block",)),
        (lambda p: p.touch(None), ("block",)),
        (lambda p: p.cache_block(p.get_new_blocks(1)[0], 5), ("hash",)),
        (lambda p: p.uncache(None), ("block",)),
    ],
)
def test_block_pool_calls_name_their_bad_arguments(call, words):
    one_line(lambda: call(BlockPool(4)), *words)
