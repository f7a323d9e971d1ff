"""Edges of the quantized and evicting caches: a layer that does not exist (Python's -1 included), a query
of another head count, attend before prepare, a float count; each a one-line KVLibError."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.evicting_cache import EvictingKVCache
from kvlib.cache.eviction_policies import SlidingWindow
from kvlib.cache.quantized import QuantizedKVCache
from kvlib.model.config import ModelConfig

CONFIG = ModelConfig(
    vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=16, max_seq_len=32
)
MAKERS = {
    "quantized": lambda: QuantizedKVCache(CONFIG, 1, 8, "int4"),
    "evicting": lambda: EvictingKVCache(CONFIG, 1, SlidingWindow(4), 8),
}


def zeros(*shape):
    return torch.zeros(shape)


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize(
    ("layer", "q", "match"),
    [
        (5, zeros(1, 2, 1, 8), "layer must be an integer from 0 to 0, not 5"),  # was an IndexError
        (-1, zeros(1, 2, 1, 8), "layer must be an integer from 0 to 0, not -1"),  # was the last layer
        (0, zeros(1, 3, 1, 8), "q has 3 heads of 8"),  # was a RuntimeError
        (0, zeros(2, 2, 1, 8), "q must be \\(1, num_heads, 1, head_dim\\)"),
    ],
)
def test_attend_refuses_what_does_not_fit_the_step(kind, layer, q, match):
    cache = MAKERS[kind]()
    cache.prepare(1)
    with pytest.raises(KVLibError, match=match):
        cache.attend(layer, q, zeros(1, 2, 1, 8), zeros(1, 2, 1, 8))


@pytest.mark.parametrize("kind", MAKERS)
def test_attend_before_prepare_and_float_counts_are_named(kind):
    with pytest.raises(KVLibError, match="attend before prepare"):
        MAKERS[kind]().attend(0, zeros(1, 2, 1, 8), zeros(1, 2, 1, 8), zeros(1, 2, 1, 8))
    with pytest.raises(KVLibError, match="cannot add 1.5 tokens"):
        MAKERS[kind]().prepare(1.5)


def test_a_float_batch_size_is_named():
    with pytest.raises(KVLibError, match="batch_size must be an integer >= 1, not 1.5"):
        QuantizedKVCache(CONFIG, 1.5, 8)
    with pytest.raises(KVLibError, match="batch_size must be an integer >= 1, not 1.5"):
        EvictingKVCache(CONFIG, 1.5, SlidingWindow(4), 8)
