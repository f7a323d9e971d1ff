"""Edge cases of PagedKVCache.attend that once crashed the process or returned wrong numbers: each is now a
one-line KVLibError, on the numba decode path exactly as on the torch path."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.paged.paged_cache import PagedKVCache

CONFIG = ModelConfig(vocab_size=32, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64)
HEAD_DIM = CONFIG.head_dim  # 8


def decode_ready(kernel=None, batch=2):
    """A cache with ``batch`` sequences of 3 tokens prefilled, each given a 4th token, then prepared."""
    cache = PagedKVCache(CONFIG, num_blocks=8, block_size=4)
    cache.decode_kernel = kernel
    for seq in range(batch):
        tokens = [1, 2, 3]
        cache.manager.allocate(seq, tokens)
        cache.schedule([seq])
        cache.prepare(3)
        kv = torch.randn(1, 2, 3, HEAD_DIM)
        for layer in range(CONFIG.num_layers):
            cache.attend(layer, torch.randn(1, 4, 3, HEAD_DIM), kv, kv)
        tokens.append(4)  # the manager reads the caller's token list
        cache.manager.append_slot(seq)
    cache.schedule(list(range(batch)))
    cache.prepare(1)
    return cache


def kv(batch=2, heads=2, new=1, head_dim=HEAD_DIM):
    return torch.randn(batch, heads, new, head_dim)


@pytest.mark.parametrize("kernel", ["numba", "torch"])
@pytest.mark.parametrize(
    ("q_shape", "match"),
    [
        (
            (3, 4, 1, HEAD_DIM),
            "q must be \\(2, num_heads, 1, head_dim\\)",
        ),  # batch != scheduled: was exit 139
        ((1, 4, 1, HEAD_DIM), "q must be \\(2, num_heads, 1, head_dim\\)"),
        ((2, 1, 1, HEAD_DIM), "q has 1 heads of 8; the cache 2 KV heads of 8"),  # was NaN
        ((2, 3, 1, HEAD_DIM), "q has 3 heads"),  # 3, 5, 7 heads: were numbers off the reference
        ((2, 5, 1, HEAD_DIM), "q has 5 heads"),
        ((2, 7, 1, HEAD_DIM), "q has 7 heads"),
        ((2, 4, 1, 4), "q has 4 heads of 4"),  # a wrong head_dim was accepted
        ((2, 4, HEAD_DIM), "q must be a 4-d tensor"),
    ],
)
def test_attend_refuses_a_query_that_does_not_fit(kernel, q_shape, match):
    cache = decode_ready(kernel)
    with pytest.raises(KVLibError, match=match):
        cache.attend(0, torch.randn(q_shape), kv(), kv())


@pytest.mark.parametrize(
    ("k", "match"),
    [
        (
            torch.randn(2, 1, 2, HEAD_DIM),
            "k must be \\(batch, num_kv_heads, num_new, head_dim\\)",
        ),  # same numel
        (torch.randn(1, 2, 2, HEAD_DIM), "k must be"),
        (
            torch.randn(2, 2, 1, HEAD_DIM, dtype=torch.float64),
            "k must be torch.float32",
        ),  # was a RuntimeError
    ],
)
def test_attend_refuses_k_of_another_shape_or_dtype(k, match):
    cache = decode_ready()
    with pytest.raises(KVLibError, match=match):
        cache.attend(0, torch.randn(2, 4, 1, HEAD_DIM), k, kv())


@pytest.mark.parametrize("layer", [-1, 2, 1.0, True])
def test_attend_refuses_a_layer_that_does_not_exist(layer):
    cache = decode_ready()
    with pytest.raises(KVLibError, match="layer must be an integer from 0 to 1"):
        cache.attend(layer, torch.randn(2, 4, 1, HEAD_DIM), kv(), kv())


def test_attend_before_prepare_is_named():
    cache = PagedKVCache(CONFIG, num_blocks=4, block_size=4)
    with pytest.raises(KVLibError, match="attend before prepare"):
        cache.attend(0, torch.randn(1, 4, 1, HEAD_DIM), kv(1), kv(1))


def test_out_of_another_shape_is_refused():
    cache = decode_ready("numba")
    with pytest.raises(KVLibError, match="out must have q's shape"):
        cache.attend(0, torch.randn(2, 4, 1, HEAD_DIM), kv(), kv(), out=torch.empty(1, 4, 1, HEAD_DIM))


@pytest.mark.parametrize("kernel", ["numba", "torch"])
def test_a_valid_decode_step_still_matches_between_kernels(kernel):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, HEAD_DIM), kv(), kv()
    outs = []
    for name in ("torch", kernel):
        torch.manual_seed(1)
        cache = decode_ready(name)
        outs.append(cache.attend(0, q, k, v))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_allocate_of_a_generator_is_named():
    from kvlib.paged.block_manager import BlockManager

    manager = BlockManager(4, 4)
    with pytest.raises(KVLibError, match="token ids must be a list or tuple"):
        manager.allocate(1, (t for t in [1, 2]))
    with pytest.raises(KVLibError, match="token ids must be a list or tuple"):
        manager.allocate(1, "abc")


def test_free_blocks_of_none_is_named():
    from kvlib.paged.block_pool import BlockPool

    pool = BlockPool(4)
    with pytest.raises(KVLibError, match="blocks must be an iterable"):
        pool.free_blocks(None)
    with pytest.raises(KVLibError, match="blocks must be an iterable"):
        pool.free_blocks(pool.get_new_blocks(1)[0])


def test_the_simulator_budget_error_names_max_len():
    from kvlib.serving.placement import make_memory

    with pytest.raises(KVLibError, match="max_len 2048"):
        make_memory("max", 1000, 2048, 16)


def test_num_blocks_for_and_uncache_name_what_they_were_given():
    from kvlib.paged.block_manager import BlockManager
    from kvlib.paged.block_pool import BlockPool

    with pytest.raises(KVLibError, match="num_tokens must be an integer >= 0"):
        BlockManager(4, 4).num_blocks_for(None)  # was a TypeError
    with pytest.raises(KVLibError, match="is not a block of this pool"):
        BlockPool(4).uncache(1)  # was an AttributeError


def test_pools_too_large_for_memory_are_a_named_error():
    big = ModelConfig(vocab_size=32, d_model=4096, num_layers=64, num_heads=32, num_kv_heads=32, d_ff=64)
    with pytest.raises(KVLibError, match="cannot allocate the K/V pools of num_blocks 4,000,000"):
        PagedKVCache(big, 4_000_000, 16)  # petabytes: refused by the allocator, named here
