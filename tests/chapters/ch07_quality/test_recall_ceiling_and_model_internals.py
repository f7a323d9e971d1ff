"""Tests of kvlib.chapters.ch07_quality.recall_ceiling (the recall an eviction policy allows) and
kvlib.chapters.ch07_quality.model_internals
(outlier channels and first-token attention), chapter 7."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.eviction_policies import H2O, SlidingWindow, StreamingLLM
from kvlib.chapters.ch07_quality.model_internals import RecordingCache, inside
from kvlib.chapters.ch07_quality.recall_ceiling import answer_ceiling
from kvlib.model.attention import grouped_attention
from kvlib.model.llama import TinyLlama
from kvlib.train.corpus import TOKEN_ID, CorpusConfig, Documents, documents
from kvlib.train.trainer import QUALITY_MODEL
from tests.single_thread import one_torch_thread  # noqa: F401

SHORT = CorpusConfig(seq_len=96, probe_from=60)


def hand_documents() -> Documents:
    """One document: the answer token (V31) at position 2 and again at 20, probed at 20."""
    filler = TOKEN_ID["."]
    ids = (
        [TOKEN_ID["<bos>"], TOKEN_ID["K3"], TOKEN_ID["V31"]] + [filler] * 15 + [TOKEN_ID["?"], TOKEN_ID["K3"]]
    )
    ids += [TOKEN_ID["V31"], filler]
    tokens = torch.tensor([ids])
    probe = torch.zeros_like(tokens, dtype=torch.bool)
    probe[0, 20] = True
    return Documents(tokens, probe.clone(), probe)


def test_ceiling_by_hand():
    docs = hand_documents()  # the query's key sits at 19; the answer's only copy at 2
    # a window holding the 18 tokens before position 19 (1 .. 18) still holds position 2
    assert answer_ceiling(docs, SlidingWindow(18)) == 1.0
    # a window of 16 holds 3 .. 18: the answer is gone
    assert answer_ceiling(docs, SlidingWindow(16)) == 0.0
    # StreamingLLM with 3 sinks keeps 0, 1, 2 whatever the window: the answer stays
    assert answer_ceiling(docs, StreamingLLM(8, 3)) == 1.0
    assert answer_ceiling(docs, StreamingLLM(8, 2)) == 0.0  # sinks 0, 1 and a window of 6


def test_ceiling_of_the_corpus_probes_is_zero_for_windows_and_sinks():
    # probes ask about facts asked nowhere before, whose value lies only in the register (positions 1 .. 24):
    # a window of 32 tokens at positions >= 60 cannot reach it, nor can 4 sinks (<bos> and the first fact,
    # which is in the register's early half and never probed)
    docs = documents(6, 3, SHORT)
    assert int(docs.probe_mask.sum()) > 0
    assert answer_ceiling(docs, SlidingWindow(32)) == 0.0
    assert answer_ceiling(docs, StreamingLLM(32, 4)) == 0.0
    assert answer_ceiling(docs, SlidingWindow(96)) == 1.0  # everything held: every answer is there


def test_ceiling_refuses_h2o_and_documents_without_probes():
    with pytest.raises(KVLibError, match="SlidingWindow or StreamingLLM"):
        answer_ceiling(hand_documents(), H2O(8, 4))
    docs = hand_documents()
    none = Documents(docs.tokens, docs.answer_mask, torch.zeros_like(docs.probe_mask))
    with pytest.raises(KVLibError, match="no probe"):
        answer_ceiling(none, SlidingWindow(8))


def test_recording_cache_gives_the_model_s_logits_and_keeps_what_it_saw():
    model = TinyLlama(QUALITY_MODEL).eval().requires_grad_(False)
    tokens = documents(2, 0, SHORT).tokens
    cache = RecordingCache(*tokens.shape)
    with torch.inference_mode():
        recorded = model(tokens, cache)
        plain = model(tokens)
    assert torch.allclose(recorded, plain, atol=1e-4)  # float32 rounding of another softmax order
    assert len(cache.keys) == len(cache.first_weight) == QUALITY_MODEL.num_layers
    assert cache.keys[0].shape == (2, QUALITY_MODEL.num_kv_heads, 96, QUALITY_MODEL.head_dim)
    # position 0 sees only itself: its weight on position 0 is 1; the weights are probabilities
    weights = cache.first_weight[0]  # (batch, heads, seq)
    assert torch.allclose(weights[..., 0], torch.ones(2, QUALITY_MODEL.num_heads))
    assert bool(((weights >= 0) & (weights <= 1)).all())
    with pytest.raises(KVLibError, match="one pass"):
        cache.prepare(1)


def test_recording_attention_equals_grouped_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 8, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    out = RecordingCache(1, 5).attend(0, q, k, v)
    assert torch.allclose(out, grouped_attention(q, k, v), atol=1e-6)


def test_inside_reports_every_layer_with_the_uniform_share_by_hand():
    model = TinyLlama(QUALITY_MODEL).eval().requires_grad_(False)
    tokens = documents(2, 0, SHORT).tokens
    layers = inside(model, tokens, from_position=94)
    assert [r.layer for r in layers] == list(range(QUALITY_MODEL.num_layers))
    # queries at positions 94 and 95 see 95 and 96 tokens: uniform shares 1/95 and 1/96, their mean
    assert layers[0].uniform_weight == pytest.approx((1 / 95 + 1 / 96) / 2, rel=1e-12)
    assert all(r.key_outlier_ratio >= 1 and r.value_outlier_ratio >= 1 for r in layers)  # max >= median
    with pytest.raises(KVLibError, match="from_position"):
        inside(model, tokens, from_position=96)
