"""Tests of kvlib.chapters.ch07_quality.compare: each lever's KV bytes per token by hand, and the levers that
lose
nothing (no quantization, a budget as long as the document, as many heads) equal the full cache
(chapter 7)."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.chapters.ch07_quality.compare import (
    evicted,
    fewer_heads,
    fp16_bytes_per_token,
    full_cache,
    quantized,
)
from kvlib.model.llama import TinyLlama
from kvlib.train.corpus import CorpusConfig, documents
from kvlib.train.trainer import QUALITY_MODEL
from tests.single_thread import one_torch_thread  # noqa: F401

# QUALITY_MODEL: 4 layers x 8 K/V heads x head_dim 16, so 32 (layer, head) pairs per token
PAIRS = 4 * 8


@pytest.fixture(scope="module")
def model() -> TinyLlama:
    return TinyLlama(QUALITY_MODEL).eval()  # random weights: the bookkeeping, not the quality, is tested


@pytest.fixture(scope="module")
def docs():
    return documents(3, 21, CorpusConfig(seq_len=64, probe_from=40))  # 3 x 64 tokens


@pytest.fixture(scope="module")
def reference(model, docs):
    return full_cache(model, docs)


def test_the_full_cache_is_its_own_reference(reference, docs):
    result, logits = reference
    assert logits.shape == (3, 64, 192)
    # fp16: 2 (K and V) x 4 layers x 8 heads x 16 values x 2 bytes = 2048 bytes per token
    assert result.kv_bytes_per_token == 2 * 4 * 8 * 16 * 2 == 2048
    assert result.quality.agreement == 1.0 and result.quality.num_probes == int(docs.probe_mask[:, 1:].sum())
    assert result.quality.perplexity > 100  # random weights: near the vocabulary's 192 (or worse)


def test_no_quantization_equals_the_reference(model, docs, reference):
    full, logits = reference
    result = quantized(model, docs, logits, "none")
    # The same K and V, attended in steps of 32: float32 rounding (~1e-6 of each logit), so the
    # perplexity agrees to 1e-5 and every greedy token is the same.
    assert result.quality.agreement == 1.0
    assert result.quality.perplexity == pytest.approx(full.quality.perplexity, rel=1e-5)
    assert result.quality.probe_recall == full.quality.probe_recall
    assert result.kv_bytes_per_token == 2048  # stored as computed, counted as the fp16 reference


def test_quantized_bytes_per_token_by_hand(model, docs, reference):
    _, logits = reference
    # int8 in groups of 16 (one per head vector): 16 codes of 1 byte + 4 bytes of fp16 scale and zero,
    # for K and V, in 32 (layer, head) pairs: (16 + 4) x 2 x 32 = 1280
    assert quantized(model, docs, logits, "int8", 16).kv_bytes_per_token == (16 + 4) * 2 * PAIRS == 1280
    # int4 in groups of 8: two groups of 8 x 0.5 byte + 4, per vector: (4 + 4) x 2 x 2 x 32 = 1024
    assert quantized(model, docs, logits, "int4", 8).kv_bytes_per_token == 2 * (4 + 4) * 2 * PAIRS == 1024
    # KIVI-4 with a residual of 32 over 64 tokens (two full groups, no residual left at the end):
    # keys per channel: 32 tokens x 0.5 byte + 4 = 20 bytes per channel per 32 tokens, x 16 channels
    # / 32 tokens = 10 bytes per token; values per token: 16 x 0.5 + 4 = 12; (10 + 12) x 32 = 704
    result = quantized(model, docs, logits, "kivi4", 16, 32)
    assert result.kv_bytes_per_token == (20 * 16 / 32 + 12) * PAIRS == 704
    assert result.setting == "group 16, residual 32"


def test_kivi_with_a_residual_longer_than_the_document_keeps_everything(model, docs, reference):
    full, logits = reference
    # Residual 128 over 64 tokens: nothing is ever quantized, every token is held in fp16 (2048 B).
    result = quantized(model, docs, logits, "kivi2", 16, 128)
    assert result.kv_bytes_per_token == 2048 and result.quality.agreement == 1.0


def test_as_many_heads_equals_the_reference_and_fewer_heads_cost_less(model, docs, reference):
    full, logits = reference
    same = fewer_heads(model, docs, logits, "as it is")
    assert same.quality.agreement == 1.0 and same.quality.perplexity == pytest.approx(full.quality.perplexity)
    assert same.setting == "8 KV heads" and same.kv_bytes_per_token == 2048
    # GQA-2: 2 x 4 layers x 2 heads x 16 x 2 bytes = 512 bytes per token
    gqa = fewer_heads(model, docs, logits, "mean-pooled", 2, "mean")
    assert gqa.kv_bytes_per_token == 2 * 4 * 2 * 16 * 2 == 512 and gqa.setting == "2 KV heads"
    assert gqa.quality.agreement < 1.0  # pooling random heads changes the model
    mqa = fewer_heads(model, docs, logits, "one head kept", 1, "keep")
    assert mqa.kv_bytes_per_token == 2 * 4 * 1 * 16 * 2 == 256


@pytest.mark.parametrize("policy", ["window", "sinks", "h2o"])
def test_a_budget_as_long_as_the_document_equals_the_reference(model, docs, reference, policy):
    full, logits = reference
    for budget in (64, 100):  # nothing is ever evicted
        result = evicted(model, docs, logits, policy, budget)
        # explicit softmax over the same keys: float32 rounding, as for the quantizer's "none"
        assert result.quality.agreement == 1.0, (policy, budget)
        assert result.quality.perplexity == pytest.approx(full.quality.perplexity, rel=1e-5)
        assert result.kv_bytes_per_token == 2048  # min(budget, 64) / 64 of the full cache


def test_eviction_bytes_per_token_at_a_quarter_budget(model):
    docs = documents(1, 5)  # one 512-token document
    _, logits = full_cache(model, docs)
    # budget 128 of 512 tokens: the full cache's 2048 bytes per token x 128 / 512 = 512
    result = evicted(model, docs, logits, "window", 128)
    assert result.kv_bytes_per_token == 2048 * 128 / 512 == 512 and result.setting == "budget 128"
    assert result.quality.agreement < 1.0  # 384 tokens attended through a 128-token window


def test_fp16_bytes_per_token_of_another_shape():
    config = QUALITY_MODEL.__class__(**{**vars(QUALITY_MODEL), "num_kv_heads": 4, "num_layers": 2})
    assert fp16_bytes_per_token(TinyLlama(config)) == 2 * 2 * 4 * 16 * 2  # 512


def test_bad_lever_arguments_are_one_line_errors(model, docs, reference):
    _, logits = reference
    cases = [
        (lambda: full_cache(model, docs.tokens), "docs must be kvlib.train.corpus.Documents, not Tensor"),
        (lambda: full_cache(torch.nn.Linear(2, 2), docs), "model must be a kvlib TinyLlama"),
        (lambda: full_cache(model, documents(1, 0, CorpusConfig(seq_len=600))), "600 tokens exceed"),
        (lambda: quantized(model, docs, logits, "int3"), "unknown KV quantization format 'int3'"),
        (lambda: quantized(model, docs, logits, "int8", step_len=0), "step_len must be a positive integer"),
        (
            lambda: quantized(model, docs, logits[:2], "int8"),
            "reference (2, 64, 192) torch.float32 must have",
        ),
        (lambda: fewer_heads(model, docs, logits, "x", 3), "num_kv_heads (3) must divide"),
        (lambda: evicted(model, docs, logits, "lru", 32), "unknown eviction policy 'lru'"),
        (lambda: evicted(model, docs, logits, "window", 0), "budget must be a positive integer, not 0"),
    ]
    for call, message in cases:
        with pytest.raises(KVLibError) as error:
            call()
        assert message in str(error.value) and "\n" not in str(error.value), message
