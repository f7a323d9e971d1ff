"""Tests of kvlib.quality.score: perplexity, recall and agreement on hand-built logits, feeding a cache in
steps, and one-line errors for what does not fit (chapter 7)."""

import math

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import ContiguousKVCache
from kvlib.model.llama import TinyLlama
from kvlib.quality.score import logits_in_steps, score_logits
from kvlib.train.corpus import CorpusConfig, Documents, documents
from kvlib.train.trainer import QUALITY_MODEL
from tests.single_thread import one_torch_thread  # noqa: F401

VOCAB = 192  # QUALITY_MODEL's vocabulary
# tokens of one hand-built document; position t's logits predict token t + 1
TOKENS = torch.tensor([[0, 5, 7, 9, 11, 13]])  # (1, 6)


def hand_docs(probes=(), tokens=TOKENS) -> Documents:
    probe_mask = torch.zeros_like(tokens, dtype=torch.bool)
    probe_mask[0, list(probes)] = True
    return Documents(tokens, probe_mask.clone(), probe_mask)


def one_hot_logits(tokens: torch.Tensor, height: float) -> torch.Tensor:
    """Logits (batch, seq, VOCAB): ``height`` at the next token, 0 elsewhere (the last position: at 0)."""
    logits = torch.zeros(*tokens.shape, VOCAB)
    targets = torch.cat([tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
    logits.scatter_(2, targets[..., None], height)
    return logits


def test_uniform_logits_have_the_vocabularys_perplexity():
    # Every next token has probability 1/192: cross-entropy ln 192, perplexity exp(ln 192) = 192.
    quality = score_logits(torch.zeros(1, 6, VOCAB), hand_docs())
    assert quality.perplexity == pytest.approx(192, rel=1e-5)
    assert quality.agreement == 1.0 and quality.num_probes == 0 and math.isnan(quality.probe_recall)


def test_one_hot_logits_by_hand():
    # Height 10 at the right token: p = e^10 / (e^10 + 191), cross-entropy ln(1 + 191 e^-10) at each of
    # the 5 scored positions, so the perplexity is 1 + 191 e^-10 = 1 + 191 x 4.540e-5 = 1.008671.
    quality = score_logits(one_hot_logits(TOKENS, 10.0), hand_docs(probes=(2, 4)))
    assert quality.perplexity == pytest.approx(1 + 191 * math.exp(-10), rel=1e-6)
    assert quality.perplexity == pytest.approx(1.008671, abs=1e-6)
    assert quality.probe_recall == 1.0 and quality.num_probes == 2


def test_half_right_half_uniform_by_hand():
    logits = one_hot_logits(TOKENS, 10.0)
    logits[0, 1:3] = 0.0  # positions 1 and 2 (predicting tokens 2 and 3) uniform: ln 192 each
    # mean cross-entropy over 5 positions: (3 ln(1 + 191 e^-10) + 2 ln 192) / 5
    expected = math.exp((3 * math.log(1 + 191 * math.exp(-10)) + 2 * math.log(192)) / 5)
    assert score_logits(logits, hand_docs()).perplexity == pytest.approx(expected, rel=1e-5)


def test_recall_counts_the_late_answers_predicted_greedily():
    logits = one_hot_logits(TOKENS, 10.0)
    logits[0, 3, 0] = 20.0  # position 3 now predicts token 0, not token 4 (= 11)
    # probes at tokens 2, 4, 5: predicted by positions 1 (right), 3 (wrong), 4 (right): 2 of 3
    quality = score_logits(logits, hand_docs(probes=(2, 4, 5)))
    assert quality.num_probes == 3 and quality.probe_recall == pytest.approx(2 / 3)
    # a probe mask at position 0 is never scored (no position predicts the first token)
    assert score_logits(logits, hand_docs(probes=(0,))).num_probes == 0


def test_agreement_against_a_reference():
    logits = one_hot_logits(TOKENS, 10.0)
    reference = logits.clone()
    reference[0, 0, 100] = 30.0  # the reference's greedy token differs at position 0 ...
    reference[0, 4, 100] = 30.0  # ... and at position 4, of the 5 scored: 3 / 5 agree
    reference[0, 5, 100] = 30.0  # the last position predicts nothing and is not compared
    assert score_logits(logits, hand_docs(), reference).agreement == pytest.approx(3 / 5)
    assert score_logits(logits, hand_docs(), logits).agreement == 1.0


def test_a_huge_loss_is_an_infinite_perplexity_not_an_overflow():
    logits = one_hot_logits(TOKENS, -1000.0)  # the right token 1000 nats below the others
    assert score_logits(logits, hand_docs()).perplexity == math.inf


@pytest.mark.parametrize(
    "logits, docs, reference, message",
    [
        (torch.zeros(1, 5, VOCAB), hand_docs(), None, "logits (1, 5) do not match documents (1, 6)"),
        (torch.zeros(6, VOCAB), hand_docs(), None, "logits must be a (batch, seq, vocab) float tensor"),
        (
            torch.zeros(1, 6, VOCAB, dtype=torch.long),
            hand_docs(),
            None,
            "float tensor, not (1, 6, 192) torch.int64",
        ),
        (torch.zeros(1, 6, 10), hand_docs(), None, "token ids must be in [0, 10)"),
        (
            torch.zeros(1, 6, VOCAB),
            hand_docs(),
            torch.zeros(1, 6, 10),
            "reference (1, 6, 10) torch.float32 must have",
        ),
        (torch.zeros(1, 6, VOCAB), hand_docs(), "full", "reference str must have"),
        (torch.zeros(1, 1, VOCAB), hand_docs(tokens=TOKENS[:, :1]), None, "documents of one token"),
        (torch.zeros(1, 6, VOCAB), TOKENS, None, "docs must be kvlib.train.corpus.Documents, not Tensor"),
        (
            torch.zeros(1, 6, VOCAB),
            Documents(TOKENS, torch.zeros(1, 6, dtype=torch.bool), torch.zeros(1, 5, dtype=torch.bool)),
            None,
            "probe_mask (1, 5) does not match tokens (1, 6)",
        ),
    ],
)
def test_what_does_not_fit_is_refused(logits, docs, reference, message):
    with pytest.raises(KVLibError) as error:
        score_logits(logits, docs, reference)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.fixture(scope="module")
def model() -> TinyLlama:
    return TinyLlama(QUALITY_MODEL).eval()  # random weights: the arithmetic, not the quality, is tested


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return documents(2, 11, CorpusConfig(seq_len=64, probe_from=40)).tokens  # (2, 64)


@pytest.mark.parametrize(
    "prompt_len, step_len", [(64, 1), (1, 1), (1, 7), (10, 5), (33, 64), (40, 24), (63, 2)]
)
def test_steps_through_a_cache_equal_one_pass(model, tokens, prompt_len, step_len):
    with torch.inference_mode():
        whole = model(tokens)  # (2, 64, vocab): no cache, the whole document at once
    cache = ContiguousKVCache(QUALITY_MODEL, 2, 64)
    stepped = logits_in_steps(model, tokens, cache, prompt_len, step_len)
    assert stepped.shape == whole.shape and cache.length == 64
    # The same attention over the same keys, grouped into other matrix products: float32 rounding
    # (~1e-6 on logits of order 1); 1e-4 is wide, and a position off by one is off by tenths.
    torch.testing.assert_close(stepped, whole, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "prompt_len, step_len, message",
    [
        (0, 1, "prompt_len must be 1 .. 64 and step_len positive, not 0, 1"),
        (65, 1, "prompt_len must be 1 .. 64"),
        (8, 0, "step_len positive, not 8, 0"),
        (8, True, "step_len must be an integer, not True"),
        (8.0, 1, "prompt_len must be an integer, not 8.0"),
    ],
)
def test_bad_steps_are_refused(model, tokens, prompt_len, step_len, message):
    with pytest.raises(KVLibError, match=message.replace("(", r"\(").replace(".", r"\.")):
        logits_in_steps(model, tokens, ContiguousKVCache(QUALITY_MODEL, 2, 64), prompt_len, step_len)


def test_a_used_cache_or_float_tokens_are_refused(model, tokens):
    cache = ContiguousKVCache(QUALITY_MODEL, 2, 128)
    logits_in_steps(model, tokens, cache, 8, 8)
    with pytest.raises(KVLibError, match="the cache must start empty, not holding 64 tokens"):
        logits_in_steps(model, tokens, cache, 8, 8)  # would score positions 64 .. 127 as 0 .. 63
    with pytest.raises(KVLibError, match=r"tokens must be a \(batch, seq\) tensor of ids"):
        logits_in_steps(model, tokens.float(), ContiguousKVCache(QUALITY_MODEL, 2, 64), 8, 8)
