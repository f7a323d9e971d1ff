"""Chapter 8's speculative-decoding measurements (kvlib.chapters.ch08_serving_engines.speculative_bench): the
draft made of
the target's layers, the sweep's counts by hand, the predicted speed-up's arithmetic, bench's
fields on a stubbed sweep. Nothing here is timed."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines import speculative_bench
from kvlib.chapters.ch08_serving_engines.speculative_bench import (
    PassCosts,
    SweepRow,
    acceptance_sweep,
    corpus_prompts,
    layer_draft,
    measure_speedup,
    pass_costs,
    predicted_speedup,
)
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama

TARGET = TinyLlama(
    ModelConfig(
        vocab_size=61, d_model=32, num_layers=3, num_heads=4, num_kv_heads=2, d_ff=64, max_seq_len=96, seed=4
    )
)


def test_a_layer_draft_is_the_target_without_the_left_out_layers():
    draft = layer_draft(TARGET, [0, 2])
    assert draft.config.num_layers == 2 and draft.config.d_model == 32
    assert torch.equal(draft.layers[1].mlp.up_proj.weight, TARGET.layers[2].mlp.up_proj.weight)
    assert torch.equal(draft.lm_head.weight, TARGET.lm_head.weight)
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        full = layer_draft(TARGET, range(3))(tokens)
        assert torch.allclose(full, TARGET(tokens), atol=1e-6)  # every layer kept: the target itself
    for bad in ([], [1, 1], [0, 3], [-1]):
        with pytest.raises(KVLibError, match="distinct increasing layer indices"):
            layer_draft(TARGET, bad)
    with pytest.raises(KVLibError, match="must be a kvlib TinyLlama"):
        layer_draft("model", [0])


def test_the_sweep_of_a_draft_that_always_agrees():
    rows = acceptance_sweep(TARGET, layer_draft(TARGET, range(3)), [[1, 2, 3], [7, 7]], num_new=9, ks=[2, 8])
    assert [r.k for r in rows] == [2, 8] and all(r.tokens_identical for r in rows)
    # k = 2: each prompt's prefill gives 1 token, then 8 = 3 + 3 + 2 in 3 rounds: 4 passes each
    assert rows[0].num_target_passes == 8 and rows[0].tokens_per_target_pass == 18 / 8
    assert rows[0].acceptance_rate == 1.0
    # k = 8: one round of 8 (7 guesses, capped) after the prefill: 2 passes each
    assert rows[1].num_target_passes == 4 and rows[1].tokens_per_target_pass == 18 / 4
    with pytest.raises(KVLibError, match="at least one prompt"):
        acceptance_sweep(TARGET, TARGET, [])


def test_predicted_speedup_by_hand():
    costs = PassCosts(target_decode_s=1.0, target_verify_s=2.0, draft_decode_s=0.5, k=2)
    row = SweepRow(2, 0.5, 2.0, 4 + 2, 6, 0, True)  # 2 prompts: 2 prefills and 4 verifications
    # plain: 2 prompts x (9 - 1) decode steps x 1.0 = 16; speculative: 4 x 2.0 + 6 x 0.5 = 11
    assert predicted_speedup(costs, row, num_new=9, num_prompts=2) == pytest.approx(16 / 11)
    assert costs.verify_ratio == 2.0 and costs.draft_ratio == 0.5  # 2.0 / 1.0 and 0.5 / 1.0


def test_measure_speedup_needs_a_prompt():
    with pytest.raises(KVLibError, match="at least one prompt"):
        measure_speedup(TARGET, TARGET, [])


def test_pass_costs_needs_room_for_the_verification():
    with pytest.raises(KVLibError, match="at least k \\+ 2 = 5 tokens, not 4"):
        pass_costs(TARGET, TARGET, [1, 2, 3, 4], 3)


def test_corpus_prompts_are_the_validation_documents_beginnings():
    prompts = corpus_prompts(2, 10)
    assert len(prompts) == 2 and all(len(p) == 10 for p in prompts)
    assert all(p[0] == 0 for p in prompts)  # every document opens with <bos>, token 0
    assert prompts[0] != prompts[1]


def test_bench_reports_the_fastest_k_and_its_acceptance(monkeypatch):
    def sweep(target, draft, prompts):
        return [SweepRow(k, 1 / k, 1.0, 10, 10, 0, True) for k in (1, 2, 3)]

    monkeypatch.setattr(speculative_bench, "acceptance_sweep", sweep)
    monkeypatch.setattr(speculative_bench, "measure_speedup", lambda t, d, p: {1: 0.7, 2: 0.9, 3: 0.8})
    assert speculative_bench.bench() == {
        "spec_decode_tokens_identical": True,
        "spec_decode_speedup": 0.9,
        "spec_decode_best_k": 2,
        "spec_decode_acceptance": 0.5,
    }
