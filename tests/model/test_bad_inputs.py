"""A hostile round on kvlib.model's configs and constructor: each bad value is a one-line KVLibError
naming the field. Found: ModelConfig took a NaN, negative or string rope_theta, a NaN or negative
norm_eps and a seed of -1, 1.5 or 2**70 (torch.manual_seed raised later); MLAConfig the same for
rope_theta and seed; TinyLlama(None) was an AttributeError, a vocabulary of 10**12 an allocator
RuntimeError, and max_seq_len 10**12 built a model whose first forward pass failed to allocate
its rotary table."""

from __future__ import annotations

import math

import pytest

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import MAX_ROTARY_POSITIONS, TinyLlama
from kvlib.model.mla import MLAConfig

TINY = dict(vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=16)


def one_line(call, *words):
    with pytest.raises(KVLibError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and len(message) < 300 and all(w in message for w in words), message


@pytest.mark.parametrize(
    "field, value",
    [
        ("rope_theta", math.nan),
        ("rope_theta", -1.0),
        ("rope_theta", 0.0),
        ("rope_theta", "1e4"),
        ("rope_theta", math.inf),
        ("norm_eps", math.nan),
        ("norm_eps", -1.0),
        ("seed", -1),
        ("seed", 1.5),
        ("seed", 2**70),
        ("seed", True),
    ],
)
def test_model_config_names_a_bad_float_or_seed(field, value):
    one_line(lambda: ModelConfig(**{**TINY, field: value}), field)
    if field != "norm_eps":
        one_line(lambda: MLAConfig(**{field: value}), field)


@pytest.mark.parametrize(
    "config, words",
    [
        (None, ("config must be a kvlib ModelConfig", "NoneType")),
        ({"vocab_size": 4}, ("config", "dict")),
        (ModelConfig(**{**TINY, "vocab_size": 10**12}), ("cannot build the model's weights",)),
        (ModelConfig(**{**TINY, "max_seq_len": 10**12}), ("max_seq_len", f"{MAX_ROTARY_POSITIONS:,}")),
    ],
)
def test_tiny_llama_names_a_config_it_cannot_build(config, words):
    one_line(lambda: TinyLlama(config), *words)


def test_the_largest_allowed_context_still_builds():
    assert (
        TinyLlama(ModelConfig(**{**TINY, "max_seq_len": MAX_ROTARY_POSITIONS})).config.max_seq_len
        == MAX_ROTARY_POSITIONS
    )
