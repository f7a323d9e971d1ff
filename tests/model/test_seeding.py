"""Tests of kvlib.model.seeding: one seed gives the same weights and leaves the caller's random stream
alone."""

import torch

from kvlib.model.config import ModelConfig
from kvlib.model.encdec import EncoderDecoder
from kvlib.model.llama import TinyLlama
from kvlib.model.seeding import seeded_weights

SMALL = ModelConfig(vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=96)


def test_seeded_weights_draws_the_same_numbers_and_restores_the_global_stream():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with seeded_weights(7):
        first = torch.rand(5)
    with seeded_weights(7):
        assert torch.equal(torch.rand(5), first)
    assert torch.equal(torch.rand(3), expected)  # as if nothing had been drawn


def test_both_models_are_built_in_it():
    for build in (TinyLlama, EncoderDecoder):
        torch.manual_seed(0)
        a = build(SMALL).state_dict()
        torch.manual_seed(1)  # the global stream does not matter
        b = build(SMALL).state_dict()
        assert all(torch.equal(a[key], b[key]) for key in a)
    with seeded_weights(SMALL.seed):
        embedding = torch.nn.Embedding(SMALL.vocab_size, SMALL.d_model)
    assert torch.equal(TinyLlama(SMALL).embed_tokens.weight, embedding.weight)  # the first weight drawn
