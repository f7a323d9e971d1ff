"""Edges of the generate entry points: token ids outside the vocabulary, float or empty prompts, each a
one-line KVLibError at the call instead of an IndexError or RuntimeError from the embedding."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.generation import generate
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import decode_branches, generate_paged

CONFIG = ModelConfig(
    vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=16, max_seq_len=32
)


@pytest.fixture(scope="module")
def model():
    return TinyLlama(CONFIG).eval()


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        (torch.tensor([[99]]), "prompt token ids must lie in 0..15"),  # was an IndexError
        (torch.tensor([[-1, 2]]), "prompt token ids must lie in 0..15"),
        (torch.tensor([[1.0, 2.0]]), "prompt must hold integer token ids"),  # was a RuntimeError
        (torch.zeros(0, 3, dtype=torch.long), "prompt must be a \\(batch >= 1, length >= 1\\)"),
    ],
)
def test_generate_refuses_prompts_the_model_cannot_read(model, prompt, match):
    with pytest.raises(KVLibError, match=match):
        generate(model, prompt, 2)


@pytest.mark.parametrize("prompts", [[[1, 99]], [[1, -2]], [[1.5]], [], "ab", [[]]])
def test_generate_paged_refuses_prompts_the_model_cannot_read(model, prompts):
    with pytest.raises(KVLibError, match="prompt"):
        generate_paged(model, prompts, 2, block_size=4)


def test_decode_branches_refuses_ids_outside_the_vocabulary(model):
    with pytest.raises(KVLibError, match="first_tokens must be a non-empty list of token ids in 0..15"):
        decode_branches(model, [1, 2], [16], 2, block_size=4)
    with pytest.raises(KVLibError, match="num_new must be an integer >= 1"):
        decode_branches(model, [1, 2], [3], 1.5, block_size=4)
