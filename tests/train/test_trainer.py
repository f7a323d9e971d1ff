"""Tests of kvlib.train.trainer: the schedule by hand, the training pass's attention, a few real steps,
and the shipped model's first losses retrained (the stored curve) (chapter 7)."""

import math

import pytest
import torch

import kvlib.train.trainer as trainer
from kvlib import KVLibError
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama
from kvlib.train.checkpoint import WEIGHTS_DIR, model_info
from kvlib.train.corpus import CorpusConfig, documents
from kvlib.train.trainer import (
    QUALITY_MODEL,
    VALIDATION_SEED,
    TrainConfig,
    WholeSequence,
    learning_rate,
    next_token_loss,
    train,
)
from tests.single_thread import one_torch_thread  # noqa: F401

SHORT = CorpusConfig(seq_len=64, probe_from=40)  # 64-token documents: a step at batch 2 takes ~20 ms
SHIPPED = WEIGHTS_DIR / "mha.safetensors"


def test_learning_rate_of_the_default_schedule_by_hand():
    config = TrainConfig()  # peak 3e-3, 100 warm-up steps, 2000 steps, down to 0.1 x peak
    # step 0: warm-up 1/100 of the peak, cosine factor 0.5 (1 + cos 0) = 1
    assert learning_rate(0, config) == pytest.approx(3e-3 * (1 / 100) * (0.1 + 0.9 * 1.0), rel=1e-12)
    assert learning_rate(0, config) == pytest.approx(3e-5, rel=1e-12)
    # step 99 ends the warm-up (100 / 100); the cosine has gone 99 / 1999 of its half period:
    # cos(pi x 0.04952) = 0.98792, so 0.5 (1 + 0.98792) = 0.99396 and 3e-3 (0.1 + 0.9 x 0.99396) = 2.9837e-3
    assert learning_rate(99, config) == pytest.approx(2.9837e-3, abs=1e-7)
    # step 98 is still warming up: 99 / 100 of the peak, cos(pi x 98 / 1999) = 0.98816 -> 0.99408
    assert learning_rate(98, config) == pytest.approx(3e-3 * (99 / 100) * (0.1 + 0.9 * 0.99408), rel=1e-5)
    # the last step, 1999: cos(pi) = -1, the cosine factor is 0 and the rate is 0.1 x the peak
    assert learning_rate(1999, config) == pytest.approx(3e-4, rel=1e-12)


def test_learning_rate_of_a_short_schedule_by_hand():
    config = TrainConfig(num_steps=5, warmup_steps=2, peak_lr=1.0, min_lr_ratio=0.0)
    # (step + 1) / 2 warm-up, at most 1; cosine 0.5 (1 + cos(pi step / 4))
    expected = [0.5 * 1.0, 1.0 * 0.5 * (1 + math.sqrt(0.5)), 0.5, 0.5 * (1 - math.sqrt(0.5)), 0.0]
    assert [learning_rate(s, config) for s in range(5)] == pytest.approx(expected, abs=1e-12)
    one_step = TrainConfig(num_steps=1, warmup_steps=1, peak_lr=2.0)
    assert learning_rate(0, one_step) == 2.0  # a one-step run trains at the peak


@pytest.mark.parametrize("step", [-1, 2000, True, 1.0])
def test_a_step_outside_the_schedule_is_refused(step):
    # past the last step the cosine would climb back towards the peak: a silently wrong rate
    with pytest.raises(KVLibError, match=r"step must be an integer in \[0, 2000\)"):
        learning_rate(step, TrainConfig())


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_steps": 0}, "num_steps must be a positive integer, not 0"),
        ({"num_steps": True}, "num_steps must be a positive integer, not True"),
        ({"batch_size": 2.0}, "batch_size must be a positive integer, not 2.0"),
        ({"warmup_steps": -5}, "warmup_steps must be a positive integer"),
        ({"peak_lr": 0.0}, "peak_lr must be a positive number, not 0.0"),
        ({"peak_lr": math.nan}, "peak_lr must be a positive number, not nan"),
        ({"peak_lr": math.inf}, "peak_lr must be a positive number"),
        ({"peak_lr": True}, "peak_lr must be a positive number, not True"),
        ({"grad_clip": "1"}, "grad_clip must be a positive number"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio must be a number in [0, 1], not 1.5"),
        ({"min_lr_ratio": math.nan}, "min_lr_ratio must be a number in [0, 1], not nan"),
        ({"min_lr_ratio": True}, "min_lr_ratio must be a number in [0, 1], not True"),
        ({"weight_decay": 1.0}, "weight_decay must be a number in [0, 1), not 1.0"),
        ({"weight_decay": -0.1}, "weight_decay must be a number in [0, 1)"),
        ({"num_steps": 2**20 + 1}, "num_steps must be at most 2**20"),
        ({"data_seed": -1}, "data_seed must be an integer in [0, 2048), not -1"),
        ({"data_seed": 2**11}, "data_seed must be an integer in [0, 2048)"),
        ({"data_seed": False}, "data_seed must be an integer in [0, 2048), not False"),
    ],
)
def test_bad_train_configs_are_one_line_errors(fields, message):
    with pytest.raises(KVLibError) as error:
        TrainConfig(**fields)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_no_training_step_draws_the_validation_documents():
    # Step s of data_seed d draws seed d x 2**20 + s; the largest, (2**11 - 1) x 2**20 + (2**20 - 1),
    # is 2**31 - 1: below the validation seed 2**31, itself below 2**32 (the generator's 32 bits).
    largest = (TrainConfig(data_seed=2**11 - 1).data_seed) * 2**20 + (
        TrainConfig(num_steps=2**20).num_steps - 1
    )
    assert largest == 2**31 - 1 and VALIDATION_SEED == 2**31
    # The old validation seed 2**40 drew step 0's documents: the regression this guards against.
    assert not torch.equal(documents(8, VALIDATION_SEED).tokens, documents(8, 0).tokens)


@pytest.mark.parametrize("num_kv_heads", [8, 2, 1])
def test_whole_sequence_attention_equals_grouped_attention(num_kv_heads):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 21, 16, generator=gen)  # (batch, heads, seq, head_dim)
    k = torch.randn(2, num_kv_heads, 21, 16, generator=gen)  # (batch, kv_heads, seq, head_dim)
    v = torch.randn(2, num_kv_heads, 21, 16, generator=gen)
    whole = WholeSequence(2, 21)
    assert torch.equal(whole.prepare(21), torch.arange(21).expand(2, 21))
    # Both are softmax(q k^T / 4) v over keys 0..i in float32, summed in another order: outputs of
    # order 1 agree to a few ulps (~1e-7); 1e-5 is wide, and a mask off by one position misses by ~0.1.
    torch.testing.assert_close(whole.attend(0, q, k, v), grouped_attention(q, k, v), atol=1e-5, rtol=0)


def test_whole_sequence_refuses_what_it_cannot_hold():
    with pytest.raises(KVLibError, match="cannot take 22"):
        WholeSequence(1, 21).prepare(22)
    with pytest.raises(KVLibError, match="4 queries, 6 keys"):
        WholeSequence(1, 6).attend(
            0, torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 6, 8)
        )
    with pytest.raises(KVLibError, match="seq_len must be a positive integer, not 0"):
        WholeSequence(1, 0)


def held_out_loss(model: TinyLlama) -> float:
    docs = documents(2, VALIDATION_SEED, SHORT)
    with torch.no_grad():
        return float(next_token_loss(model, docs.tokens))


def test_three_steps_lower_the_loss_at_the_full_runs_learning_rates(monkeypatch):
    model = TinyLlama(QUALITY_MODEL)
    before = held_out_loss(model)
    seen = []  # (step, num_steps) of every learning rate the run asked for

    def recording(step, config):
        seen.append((step, config.num_steps))
        return learning_rate(step, config)

    monkeypatch.setattr(trainer, "learning_rate", recording)
    config = TrainConfig(num_steps=100, batch_size=2, warmup_steps=1)  # at the peak from the first step
    result = train(model, config, SHORT, stop_after=3)
    assert seen == [(0, 100), (1, 100), (2, 100)]  # the first 3 steps of the 100-step schedule
    assert len(result.losses) == 3 and result.num_threads == 1
    # Untrained, the loss is ~5.5 nats (ln 192 = 5.26 is uniform); three steps at 3e-3 learn the
    # token frequencies and take off several tenths of a nat on documents never trained on.
    assert before > 5.0 and held_out_loss(model) < before - 0.2
    assert not model.training


def test_the_lean_pass_after_training_equals_the_modules():
    model = LeanLlama(QUALITY_MODEL)
    tokens = documents(2, VALIDATION_SEED, SHORT).tokens
    with torch.inference_mode():
        untrained = model(tokens)  # builds the lean pass's fused weights of the untrained model
    train(model, TrainConfig(num_steps=10, batch_size=2, warmup_steps=1), SHORT, stop_after=2)
    with torch.inference_mode():
        lean, reference = model(tokens), model.reference_forward(tokens)
    # The lean pass sums the same products in another grouping (kvlib.model.lean): ~1e-6 on logits
    # of order 1; stale fused weights would give the untrained logits, tenths away.
    torch.testing.assert_close(lean, reference, atol=1e-4, rtol=0)
    assert (lean - untrained).abs().max() > 0.05


def test_two_seeded_runs_give_the_same_losses_and_weights():
    # Needs no shipped file: the model's weights and every step's documents are seeded.
    runs = []
    for _ in range(2):
        model = TinyLlama(QUALITY_MODEL)
        runs.append((train(model, TrainConfig(batch_size=2), stop_after=3).losses, model.state_dict()))
    (losses_a, state_a), (losses_b, state_b) = runs
    assert len(losses_a) == 3 and losses_a == losses_b
    assert all(torch.equal(state_a[name], state_b[name]) for name in state_a)
    other = train(TinyLlama(QUALITY_MODEL), TrainConfig(batch_size=2, data_seed=1), stop_after=3).losses
    assert other != losses_a  # other documents, other losses (the seed is used)


@pytest.mark.skipif(
    not SHIPPED.is_file(), reason=f"{SHIPPED.name} is not shipped yet (python -m kvlib train)"
)
def test_retraining_reproduces_the_shipped_models_first_losses():
    info = model_info(SHIPPED)
    assert (info["num_steps"], info["batch_size"], info["data_seed"]) == (2000, 8, 0), info
    stored = info["first_losses"]
    assert len(stored) == 5
    losses = train(TinyLlama(QUALITY_MODEL), TrainConfig(), stop_after=5).losses
    # Margin 2e-3 nats. The first loss is the untrained model's on step 0's documents: the same
    # numbers on every machine up to float32 rounding of the forward pass (~1e-6) and the stored
    # rounding to 4 digits (5e-5). The next four follow updates at 3e-5 .. 1.2e-4 (the warm-up):
    # Adam moves each weight by about the learning rate whatever its gradient, so rounding changes
    # an update's size only where a gradient is near zero, where it changes the loss least; the
    # drift after four such updates stays orders below 2e-3 (one and two threads gave identical
    # losses here). What the test must catch moves them more: data_seed 1 moves the first loss by
    # 7e-3, twice the learning rate (or half the warm-up) the second by 8e-3 and the fifth by 8e-2.
    assert losses == pytest.approx(stored, abs=2e-3)


def test_bad_train_arguments_are_one_line_errors():
    model = TinyLlama(QUALITY_MODEL)
    config = TrainConfig(num_steps=4)
    for stop_after in (0, 5, True, 2.0):
        with pytest.raises(KVLibError, match=r"stop_after must be an integer in \[1, 4\]"):
            train(model, config, SHORT, stop_after=stop_after)
    with pytest.raises(KVLibError, match="must be a kvlib TinyLlama"):
        train(torch.nn.Linear(2, 2), config, SHORT)
    with pytest.raises(KVLibError, match="config must be a TrainConfig"):
        train(model, {"num_steps": 4}, SHORT)
    short_model = TinyLlama(
        ModelConfig(vocab_size=192, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=32)
    )
    with pytest.raises(KVLibError, match="documents of 64 tokens exceed the model's 32"):
        train(short_model, config, SHORT)
    small_vocab = TinyLlama(
        ModelConfig(vocab_size=100, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64)
    )
    with pytest.raises(KVLibError, match="100 embeddings miss corpus tokens"):
        train(small_vocab, config, SHORT)
    with pytest.raises(KVLibError, match="no trainable parameter"):
        train(TinyLlama(QUALITY_MODEL).requires_grad_(False), config, SHORT)
    with pytest.raises(KVLibError, match="on_step must be callable"):
        train(model, config, SHORT, on_step="print")
    with pytest.raises(KVLibError, match="config must be a TrainConfig, not dict"):
        learning_rate(0, {"num_steps": 4})


def test_a_diverging_run_stops_with_an_error_and_leaves_eval_mode():
    model = TinyLlama(QUALITY_MODEL)
    # A rate of 1e4 sends Adam's updates to 1e4 per weight: the logits overflow within a few steps.
    config = TrainConfig(num_steps=20, batch_size=1, warmup_steps=1, peak_lr=1e4, grad_clip=1e30)
    with pytest.raises(KVLibError, match="training diverged at step"):
        train(model, config, SHORT)
    assert not model.training


def test_a_failing_callback_leaves_the_model_in_eval_mode():
    model = TinyLlama(QUALITY_MODEL)

    def stop(step, loss):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(model, TrainConfig(num_steps=3, batch_size=1), SHORT, on_step=stop)
    assert not model.training
