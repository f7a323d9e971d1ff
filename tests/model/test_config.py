"""Tests of kvlib.model.config: bad model shapes are named errors."""

import pytest

from kvlib import KVLibError
from kvlib.model.config import ModelConfig

SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, d_ff=96, max_seq_len=128)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(d_model=65), "d_model .* divisible by num_heads"),
        (dict(num_kv_heads=3), "num_heads .* divisible by num_kv_heads"),
        (dict(num_layers=0), "num_layers must be a positive integer"),
        (dict(d_model=12, num_heads=4), "head_dim .* must be even"),
    ],
)
def test_bad_configs_are_named(bad, message):
    with pytest.raises(KVLibError, match=message):
        ModelConfig(**{**SMALL, **bad})
