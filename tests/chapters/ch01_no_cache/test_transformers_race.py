"""Tests of kvlib.chapters.ch01_no_cache.transformers_race: transformers' generate timed beside ours, by one
protocol.
"""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.generation import generate
from kvlib.chapters.ch01_no_cache.transformers_race import GENERATORS, race_generators, time_hf_generate
from kvlib.model.config import ModelConfig
from kvlib.model.hf import (
    random_hf_llama,
)
from kvlib.model.llama import TinyLlama
from tests.single_thread import one_torch_thread  # noqa: F401

SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, d_ff=96, max_seq_len=128)


def test_time_hf_generate_rejects_bad_lengths():
    hf_model = random_hf_llama(ModelConfig(**SMALL, num_kv_heads=2))
    with pytest.raises(KVLibError, match="num_new"):
        time_hf_generate(hf_model, torch.zeros(1, 1, dtype=torch.long), 0, use_cache=True)


def test_race_generators_times_every_generator_and_keeps_their_tokens():
    model = TinyLlama(ModelConfig(**SMALL, num_kv_heads=2)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    versus = race_generators(model, prompt, 10, repeats=2)
    ours = generate(model, prompt, 10, "cache").tokens
    assert set(versus.timings) == set(versus.tokens) == set(GENERATORS)
    assert all(torch.equal(tokens, ours) for tokens in versus.tokens.values())
    assert all(len(t.samples) == 2 for t in versus.timings.values())
    # tokens per second of the fastest run: 10 tokens of one sequence
    assert versus.tokens_per_s("kvlib cache") == 10 / versus.timings["kvlib cache"].min_s
    with pytest.raises(KVLibError, match="no generator"):
        race_generators(model, prompt, 2, repeats=1, names=("kvlib cache",)).tokens_per_s(
            "transformers cache"
        )
    with pytest.raises(KVLibError, match="names"):
        race_generators(model, prompt, 2, names=("kvlib cache", "vllm"))
    with pytest.raises(KVLibError, match="num_new"):
        race_generators(model, prompt, 0)
