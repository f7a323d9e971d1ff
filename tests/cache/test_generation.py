"""Tests of kvlib.cache.generation: step-by-step decoding (Decoder), bad input named, and the chapter
model's safety margin for identical tokens."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.generation import Decoder, generate
from kvlib.chapters.ch01_no_cache.nocache_race import CPU_CONFIG
from kvlib.measure.timing import torch_threads
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from tests.single_thread import one_torch_thread  # noqa: F401

SMALL = ModelConfig(
    vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=96, max_seq_len=128
)


def test_last_only_returns_the_last_position_of_a_full_pass():
    model = TinyLlama(SMALL).eval()
    tokens = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full, last = model(tokens), model(tokens, last_only=True)
    assert last.shape == (2, 1, 97)
    assert torch.allclose(full[:, -1:], last, atol=1e-6)


@pytest.mark.parametrize("mode", ["none", "cache", "concat"])
def test_decoder_steps_equal_generate(mode):
    model = TinyLlama(SMALL).eval()
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    decoder = Decoder(model, prompt, 6, mode)
    logits = [decoder.step() for _ in range(6)]
    reference = generate(model, prompt, 6, mode)
    assert torch.equal(decoder.tokens, reference.tokens)
    assert decoder.tokens.shape == (2, 9) and logits[0].shape == (2, 97)
    with pytest.raises(KVLibError, match="generated them all"):
        decoder.step()


def test_decoder_rejects_a_prompt_that_is_not_a_tensor():
    with pytest.raises(KVLibError, match="prompt must be"):
        Decoder(TinyLlama(SMALL), [[1, 2]], 3)
    with pytest.raises(KVLibError, match="num_new"):
        Decoder(TinyLlama(SMALL), torch.zeros(1, 2, dtype=torch.long), True)


def test_chapter_model_choices_are_far_from_ties():
    """Identical tokens across paths are robust only if no step's best two logits nearly tie.

    Over the first 80 tokens of the chapter's CPU model (the notebook checks all of its run)
    the smallest gap between the best and second-best logit must exceed the paths' largest
    logit difference a thousandfold (observed: gap ~6e-3, difference ~1e-6), so rounding on
    another machine cannot flip a token.
    """
    model = TinyLlama(CPU_CONFIG).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long)
    with torch_threads(1):  # a quick, steady run even when other programs share the two cores
        cached, uncached = generate(model, prompt, 80, "cache"), generate(model, prompt, 80, "none")
    assert torch.equal(cached.tokens, uncached.tokens)
    logits_c, logits_n = torch.stack(cached.step_logits), torch.stack(uncached.step_logits)
    top2 = logits_n.topk(2, dim=-1).values
    min_gap = (top2[..., 0] - top2[..., 1]).min().item()
    max_diff = (logits_c - logits_n).abs().max().item()
    assert max_diff < 1e-4
    assert min_gap > 1000 * max(max_diff, 1e-7), (min_gap, max_diff)


def test_generate_rejects_bad_input():
    model = TinyLlama(SMALL)
    prompt = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(KVLibError, match="mode"):
        generate(model, prompt, 3, mode="fast")
    with pytest.raises(KVLibError, match="num_new"):
        generate(model, prompt, 0)
    with pytest.raises(KVLibError, match="max_seq_len"):
        generate(model, prompt, 200)
    with pytest.raises(KVLibError, match="prompt"):
        generate(model, torch.zeros(4, dtype=torch.long), 3)


def test_decoder_writes_tokens_into_one_buffer_and_earlier_views_stay_put():
    model = TinyLlama(SMALL).eval()
    decoder = Decoder(model, torch.tensor([[3, 1, 4], [1, 5, 9]], dtype=torch.int32), 4)
    decoder.step()
    after_one = decoder.tokens
    buffer = after_one.untyped_storage().data_ptr()
    for _ in range(3):
        decoder.step()
    assert decoder.tokens.untyped_storage().data_ptr() == buffer and decoder.tokens.shape == (2, 7)
    assert torch.equal(after_one, decoder.tokens[:, :4]) and after_one.shape == (2, 4)
    assert decoder.tokens.dtype == torch.long
    assert torch.equal(decoder.tokens[:, :3], torch.tensor([[3, 1, 4], [1, 5, 9]]))
