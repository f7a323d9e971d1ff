"""TinyLlama.forward, called directly by a reader, names tokens it cannot embed (one line, no torch error)."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama

MODEL = TinyLlama(ModelConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32))


@pytest.mark.parametrize(
    ("tokens", "words"),
    [
        (torch.tensor([[1, 32]]), "token ids"),  # one past the vocabulary: an IndexError from the embedding
        (torch.tensor([[-1, 2]]), "token ids"),
        (torch.tensor([[1.0, 2.0]]), "integer token ids"),
        (torch.tensor([1, 2]), "(batch >= 1, length >= 1)"),
        (torch.zeros(1, 0, dtype=torch.long), "(batch >= 1, length >= 1)"),
        ([[1, 2]], "(batch >= 1, length >= 1)"),
    ],
    ids=["past-vocab", "negative", "float", "1-d", "empty", "list"],
)
def test_forward_names_tokens_it_cannot_embed(tokens, words):
    with pytest.raises(KVLibError, match="tokens") as error:
        MODEL(tokens)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_forward_still_gives_logits_for_good_tokens():
    assert MODEL(torch.tensor([[1, 2, 31]])).shape == (1, 3, 32)


@pytest.mark.parametrize("cache", [42, "cache", object()], ids=["int", "str", "object"])
def test_forward_names_a_cache_that_is_no_cache(cache):
    with pytest.raises(KVLibError, match="cache must be a KV cache"):
        MODEL(torch.tensor([[1, 2]]), cache)
