"""A hostile round on kvlib.paged's public edges: each bad call is a one-line KVLibError
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
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.block_pool import BlockPool
from kvlib.paged.hybrid_manager import (
    HybridBlockManager,
    KVGroupSpec,
    first_needed_block,
    held_blocks_per_sequence,
)
from kvlib.paged.offload_tier import CPUTier, DiskTier, OffloadingCache, TieredStore, entry_bytes
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.paged.radix_cache import radix_paged_cache
from kvlib.paged.window_cache import (
    WindowedPagedCache,
    generate_windowed,
    masked_attention,
    window_groups,
    window_mask,
)

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


# ------------------------------------------------------------ the window cache (chapter 10)
# Found: a window list of None or 5, schedule(5), attend at layer 5 or -1 or with q, k of other shapes or
# dtypes, window_mask of a window of 0 or of a list, masked_attention of shapes that do not fit and
# generate_windowed of no model, no prompts or a token outside the vocabulary were TypeError,
# IndexError, RuntimeError or AttributeError; schedule([9]) of an unknown sequence passed.


@pytest.mark.parametrize("windows", [None, 5, "ab", [], [0, None], [-1, None], [1.5, None], [math.nan, None]])
def test_windows_that_are_no_list_of_windows_are_named(windows):
    one_line(lambda: window_groups(windows), "window")
    one_line(lambda: WindowedPagedCache(CONFIG, windows, 8, 4), "window")


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: WindowedPagedCache(None, [None, None], 8, 4), ("config",)),
        (lambda: WindowedPagedCache(CONFIG, [None, 4], 8, 4, allocator_windows=5), ("windows",)),
        (lambda: WindowedPagedCache(CONFIG, [None, 4], math.nan, 4), ("num_blocks",)),
        (lambda: WindowedPagedCache(CONFIG, [None, None, None], 8, 4), ("3 entries for 2 layers",)),
    ],
)
def test_the_window_cache_names_what_it_cannot_be_built_from(call, words):
    one_line(call, *words)


def windowed_pass():
    cache = WindowedPagedCache(CONFIG, [None, 4], 8, 4)
    cache.manager.allocate(0, 3)
    cache.schedule([0])
    cache.prepare(3)
    return cache


def test_window_cache_schedule_and_prepare_name_their_bad_arguments():
    cache = WindowedPagedCache(CONFIG, [None, 4], 8, 4)
    one_line(lambda: cache.prepare(1), "no sequences scheduled")
    one_line(lambda: cache.schedule(5), "seq_ids", "int")
    one_line(lambda: cache.schedule([9]), "9")
    one_line(lambda: cache.schedule([]), "distinct sequences")


@pytest.mark.parametrize(
    "layer, q, k, words",
    [
        (5, torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8), ("layer",)),
        (-1, torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8), ("layer",)),
        (0, torch.zeros(1, 3, 3, 8), torch.zeros(1, 2, 3, 8), ("heads",)),
        (0, torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 2, 8), ("k must be",)),
        (0, torch.zeros(1, 4, 3, 4), torch.zeros(1, 2, 3, 8), ("head_dim",)),
        (0, torch.zeros(1, 4, 3, 8, dtype=torch.float64), torch.zeros(1, 2, 3, 8), ("dtype",)),
        (0, [1], torch.zeros(1, 2, 3, 8), ("q must be a 4-d tensor",)),
    ],
)
def test_window_cache_attend_names_what_does_not_fit(layer, q, k, words):
    one_line(lambda: windowed_pass().attend(layer, q, k, torch.zeros(1, 2, 3, 8)), *words)


def test_window_cache_attend_still_runs_a_right_pass():
    out = windowed_pass().attend(0, torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    assert out.shape == (1, 4, 3, 8) and bool(out.isfinite().all())


@pytest.mark.parametrize(
    "args, words",
    [
        ((torch.arange(3)[None], 3, 0), ("window",)),
        ((torch.arange(3)[None], 3, -1), ("window",)),
        ((torch.arange(3)[None], -1, None), ("num_keys",)),
        (([0, 1], 3, None), ("positions",)),
        ((torch.arange(3), 3, None), ("positions",)),
    ],
)
def test_window_mask_names_its_bad_arguments(args, words):
    one_line(lambda: window_mask(*args), *words)


def test_masked_attention_names_shapes_that_do_not_fit():
    q, k = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 5, 8)
    one_line(lambda: masked_attention(q, k, k, torch.ones(3, 4, dtype=torch.bool)), "visible")
    one_line(
        lambda: masked_attention(q, k, torch.zeros(1, 2, 4, 8), torch.ones(1, 3, 5, dtype=torch.bool)),
        "k and v",
    )
    one_line(
        lambda: masked_attention(torch.zeros(1, 3, 3, 8), k, k, torch.ones(1, 3, 5, dtype=torch.bool)),
        "heads",
    )
    assert masked_attention(q, k, k, torch.ones(1, 3, 5, dtype=torch.bool)).shape == q.shape


MODEL = TinyLlama(CONFIG)


@pytest.mark.parametrize(
    "model, prompts, num_new, words",
    [
        (None, [[1, 2]], 2, ("model",)),
        (MODEL, None, 2, ("prompts",)),
        (MODEL, [], 2, ("prompts",)),
        (MODEL, [[]], 2, ("prompt",)),
        (MODEL, [[999]], 2, ("0..63",)),
        (MODEL, [[1.5]], 2, ("prompt",)),
        (MODEL, [[1, 2]], -1, ("num_new",)),
        (MODEL, [[1, 2]], math.nan, ("num_new",)),
    ],
)
def test_generate_windowed_names_its_bad_arguments(model, prompts, num_new, words):
    one_line(lambda: generate_windowed(model, prompts, num_new, [None, 4], 4, 16), *words)


# ------------------------------------------------------------ the offload tier (chapter 12)
# Found: DiskTier(directory="/proc/x"), of a file or of 5 were OSError or TypeError; put of None or a
# list was TypeError or AttributeError, of K and V of other shapes passed, of a meta tensor was
# NotImplementedError, of a 300-character key OSError (file name too long); TieredStore("x") and
# CPUTier(pin_memory="x") passed.

PAIR = (torch.zeros(2), torch.zeros(2))


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: DiskTier(100, directory="/proc/x"), ("disk tier cannot use", "/proc/x")),
        (lambda: DiskTier(100, directory="/etc/passwd"), ("disk tier cannot use",)),
        (lambda: DiskTier(100, directory=5), ("directory",)),
        (lambda: CPUTier(100, pin_memory="x"), ("pin_memory",)),
        (lambda: CPUTier(-1), ("capacity_bytes",)),
        (lambda: DiskTier(math.nan), ("capacity_bytes",)),
        (lambda: TieredStore("x"), ("CPUTier",)),
        (lambda: TieredStore(DiskTier(10), CPUTier(10)), ("CPUTier", "DiskTier")),
        (lambda: TieredStore(None, None), ("needs",)),
        (lambda: OffloadingCache(None, None), ("PagedKVCache",)),
        (lambda: OffloadingCache(PagedKVCache(CONFIG, 8, 4), "x"), ("store",)),
        (lambda: entry_bytes(None), ("entry",)),
        (lambda: entry_bytes([1, 2]), ("entry",)),
    ],
)
def test_tiers_name_what_they_cannot_be_built_from(call, words):
    one_line(call, *words)


@pytest.mark.parametrize("tier", [lambda: CPUTier(10**6), lambda: DiskTier(10**6)], ids=["cpu", "disk"])
@pytest.mark.parametrize(
    "key, entry, words",
    [
        ("a", None, ("entry",)),
        ("a", [1, 2], ("entry",)),
        ("a", (torch.zeros(2),) * 3, ("entry",)),
        ("a", (torch.zeros(2), torch.zeros(3)), ("one shape",)),
        ("a", (torch.zeros(2, device="meta"),) * 2, ("meta",)),
        (5, PAIR, ("block key",)),
        ("../x", PAIR, ("block key",)),
        ("a/b", PAIR, ("block key",)),
        ("", PAIR, ("block key",)),
        ("x" * 300, PAIR, ("block key", "at most 128")),
    ],
)
def test_a_tier_names_an_entry_or_key_it_cannot_keep(tier, key, entry, words):
    one_line(lambda: tier().put(key, entry), *words)


def test_the_disk_tier_reads_back_a_strided_block():
    tier = DiskTier(10**6)
    k = torch.arange(6.0).view(2, 3).t()  # not contiguous
    tier.put("nc", (k, torch.zeros(3, 2)))
    assert torch.equal(tier.get("nc")[0], k)
    tier.close()


# ------------------------------------------------------------ the hybrid manager, the radix cache
# Found: first_needed_block and held_blocks_per_sequence of block_size 0 were ZeroDivisionError, of
# None groups a TypeError, of -5 tokens 0; KVGroupSpec took a name of 5; radix_paged_cache(None) was
# an AttributeError.

GROUPS = [KVGroupSpec("full", 2), KVGroupSpec("win", 2, window=4)]


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: first_needed_block(5, 4, 0), ("block_size",)),
        (lambda: first_needed_block(5, 0, 4), ("window",)),
        (lambda: first_needed_block(-5, 4, 4), ("num_computed",)),
        (lambda: first_needed_block(math.nan, 4, 4), ("num_computed",)),
        (lambda: held_blocks_per_sequence(GROUPS, 5, 0), ("block_size",)),
        (lambda: held_blocks_per_sequence(GROUPS, -1, 4), ("num_tokens",)),
        (lambda: held_blocks_per_sequence(None, 5, 4), ("groups",)),
        (lambda: KVGroupSpec(5, 2), ("name",)),
        (lambda: KVGroupSpec("g", 0), ("num_layers",)),
        (lambda: KVGroupSpec("g", 2, window=math.nan), ("window",)),
        (lambda: HybridBlockManager(GROUPS, 8, 4, "x"), ("free_out_of_window",)),
        (lambda: HybridBlockManager(None, 8, 4), ("groups",)),
        (lambda: radix_paged_cache(None, 8, 4), ("model",)),
        (lambda: radix_paged_cache(MODEL, 0, 4), ("num_blocks",)),
    ],
)
def test_hybrid_and_radix_helpers_name_their_bad_arguments(call, words):
    one_line(call, *words)


def test_the_checked_helpers_still_agree_with_the_manager():
    """10 tokens, window 4, blocks of 4: the next query sees keys 7.. so block 0 is no longer read."""
    assert first_needed_block(10, 4, 4) == 1
    assert held_blocks_per_sequence(GROUPS, 10, 4) == 3 + 2
    manager = HybridBlockManager(GROUPS, 16, 4)
    manager.allocate(0, 10)
    manager.mark_computed(0, 10)
    assert manager.num_held_blocks(0) == held_blocks_per_sequence(GROUPS, 10, 4)
