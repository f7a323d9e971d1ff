"""Training the quality chapter's model: the seeded loop behind ``python -m kvlib train`` (chapter 7).

The book's other models keep their random weights; chapter 7 needs one that has learned
something a smaller cache can take away. :data:`QUALITY_MODEL` is a multi-head
:class:`~kvlib.model.llama.TinyLlama` (8 K/V heads, so that they can be pooled later) with a
512-token context, and :func:`train` fits it to :mod:`kvlib.train.corpus` by next-token
cross-entropy with AdamW (warm-up, then cosine decay; gradients clipped). Every step draws its
own documents from ``data_seed`` and the step number, so a run is the same on every machine up
to float rounding (which depends on the CPU and the thread count), and a test can retrain a few
steps and compare the first losses with the stored curve.

Training attends through :class:`WholeSequence`, a stand-in for a cache that holds exactly the
sequence being trained on: PyTorch's fused causal attention (three times faster here than the
explicit softmax of :func:`~kvlib.model.attention.grouped_attention`, and equal to it up to
float rounding). The same class serves uptraining after
:func:`~kvlib.model.head_pooling.pool_kv_heads` (the GQA paper's 5 % of the steps).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.checks import is_int
from kvlib.model.config import ModelConfig
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama
from kvlib.train.corpus import VOCAB, CorpusConfig, documents

# The model chapter 7 trains: vocabulary rounded up to a multiple of 64, head_dim 16, 0.9 M parameters.
QUALITY_MODEL = ModelConfig(
    vocab_size=192,
    d_model=128,
    num_layers=4,
    num_heads=8,
    num_kv_heads=8,
    d_ff=384,
    max_seq_len=512,
    seed=1,
)
assert QUALITY_MODEL.vocab_size >= len(VOCAB), "the model must have an embedding for every corpus token"
# Seeds of the documents (kvlib.train.corpus.documents takes [0, 2**32): torch's CPU generator keeps a
# seed's low 32 bits). Training step s of data_seed d draws seed d * 2**20 + s with s < 2**20 and
# d < 2**11, all below 2**31; the validation documents are drawn from 2**31, a seed no run trains on.
MAX_STEPS = 2**20  # steps of one run: step s's seed must not reach the next data_seed's
MAX_BATCH_SIZE = 1024  # documents per step: 128 times the default, so that a typo cannot stall the run
MAX_DATA_SEED = 2**11  # data_seed * 2**20 + step stays below VALIDATION_SEED
VALIDATION_SEED = 2**31  # the documents chapter 7 scores every lever on, never trained on


@dataclass(frozen=True)
class TrainConfig:
    """One training run; the defaults trained the shipped model (``python -m kvlib train``)."""

    num_steps: int = 2000  # optimizer steps
    batch_size: int = 8  # documents per step (each CorpusConfig.seq_len tokens)
    peak_lr: float = 3e-3  # learning rate after warm-up
    warmup_steps: int = 100  # linear warm-up from peak_lr / warmup_steps
    min_lr_ratio: float = 0.1  # the cosine decays to peak_lr * min_lr_ratio at the last step
    weight_decay: float = 0.1  # AdamW's decoupled weight decay
    grad_clip: float = 1.0  # largest gradient norm
    data_seed: int = 0  # step s trains on documents(batch_size, data_seed * 2**20 + s); < 2**11

    def __post_init__(self):
        for name in ("num_steps", "batch_size", "warmup_steps"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise KVLibError(f"TrainConfig.{name} must be a positive integer, not {value!r}")
        if self.batch_size > MAX_BATCH_SIZE:
            raise KVLibError(
                f"TrainConfig.batch_size must be at most {MAX_BATCH_SIZE}, not {self.batch_size!r}"
            )
        if self.num_steps > MAX_STEPS:
            raise KVLibError(f"TrainConfig.num_steps must be at most 2**20, not {self.num_steps!r}")
        for name in ("peak_lr", "grad_clip"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise KVLibError(f"TrainConfig.{name} must be a positive number, not {value!r}")
        if not _is_number(self.min_lr_ratio) or not 0 <= self.min_lr_ratio <= 1:
            raise KVLibError(
                f"TrainConfig.min_lr_ratio must be a number in [0, 1], not {self.min_lr_ratio!r}"
            )
        if not _is_number(self.weight_decay) or not 0 <= self.weight_decay < 1:
            raise KVLibError(
                f"TrainConfig.weight_decay must be a number in [0, 1), not {self.weight_decay!r}"
            )
        if not is_int(self.data_seed) or not 0 <= self.data_seed < MAX_DATA_SEED:
            raise KVLibError(
                f"TrainConfig.data_seed must be an integer in [0, {MAX_DATA_SEED}), not {self.data_seed!r}"
            )


def _is_number(value) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class TrainResult:
    """What a run leaves besides the weights."""

    losses: tuple[float, ...]  # training loss of every step, in nats per token
    seconds: float  # wall-clock time of the run
    num_threads: int  # torch's intra-op threads during the run


class WholeSequence:
    """The :class:`~kvlib.model.config.KVCache` of a training pass: the batch is the whole sequence.

    ``prepare`` gives positions 0 .. n-1 and ``attend`` runs causal attention over the new
    tokens alone, by PyTorch's fused kernel; nothing is stored.
    """

    def __init__(self, batch_size: int, seq_len: int, device=None):
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
            if not is_int(value) or value < 1:
                raise KVLibError(f"WholeSequence {name} must be a positive integer, not {value!r}")
        # (batch, seq_len), on the tokens' device (the rotary table is looked up there)
        self.positions = torch.arange(seq_len, device=device).expand(batch_size, seq_len)

    def prepare(self, num_new: int) -> torch.Tensor:
        """Positions of a whole sequence of ``num_new`` tokens, (batch, num_new)."""
        if not 1 <= num_new <= self.positions.shape[1]:
            raise KVLibError(f"a WholeSequence of {self.positions.shape[1]} tokens cannot take {num_new}")
        return self.positions[:, :num_new]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of q (batch, heads, seq, head_dim) over k, v (batch, kv_heads, seq, head_dim)."""
        if k.shape[2] != q.shape[2]:  # is_causal aligns the first query with the first key
            raise KVLibError(
                f"WholeSequence attends a sequence to itself: {q.shape[2]} queries, {k.shape[2]} keys"
            )
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``peak_lr``, then cosine decay to ``peak_lr * min_lr_ratio`` at the last step.

    ``step`` counts from 0 to ``config.num_steps - 1``; past the end the cosine would climb
    again, so a step outside the schedule is refused.
    """
    if not isinstance(config, TrainConfig):
        raise KVLibError(f"config must be a TrainConfig, not {type(config).__name__}")
    if not is_int(step) or not 0 <= step < config.num_steps:
        raise KVLibError(f"step must be an integer in [0, {config.num_steps}), not {step!r}")
    warm = min(1.0, (step + 1) / config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * step / max(1, config.num_steps - 1)))
    return config.peak_lr * warm * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def next_token_loss(model: TinyLlama, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1] (batch, seq), a scalar."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (batch, seq - 1) each
    whole = WholeSequence(*inputs.shape, device=inputs.device)
    logits = TinyLlama.forward(model, inputs, whole)  # (batch, seq - 1, vocab): the modules' pass
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train(
    model: TinyLlama,
    config: TrainConfig | None = None,
    corpus: CorpusConfig | None = None,
    on_step: Callable[[int, float], None] | None = None,
    stop_after: int | None = None,
) -> TrainResult:
    """Train ``model`` in place on the corpus; ``on_step(step, loss)`` is called after every step.

    ``stop_after`` runs only the first steps of ``config``'s schedule, at the learning rates of
    the whole run (a test retrains the first steps of the shipped model's run this way). The
    model is left in eval mode (a :class:`~kvlib.model.lean.LeanLlama` with its fused weights dropped,
    rebuilt on first use),
    also when a step fails. A loss that is not finite stops the run with a
    :class:`~kvlib.KVLibError` rather than training on.
    """
    config = TrainConfig() if config is None else config
    corpus = CorpusConfig() if corpus is None else corpus
    num_steps = _check_train_args(model, config, corpus, on_step, stop_after)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]  # matrices decay; norm scales do not
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=config.peak_lr,
        betas=(0.9, 0.95),
    )
    device = model.embed_tokens.weight.device
    losses, start = [], time.perf_counter()
    model.train()
    try:
        for step in range(num_steps):
            lr = learning_rate(step, config)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = documents(config.batch_size, config.data_seed * 2**20 + step, corpus)
            loss = next_token_loss(model, batch.tokens.to(device))  # drawn on the CPU, the same everywhere
            if not torch.isfinite(loss):
                raise KVLibError(f"training diverged at step {step}: the loss is {loss.item()}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            opt.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(step, losses[-1])
    finally:
        model.eval()
        if isinstance(model, LeanLlama):
            model.fused.clear()  # the lean pass fuses the trained weights afresh
    return TrainResult(tuple(losses), time.perf_counter() - start, torch.get_num_threads())


def _check_train_args(model, config, corpus, on_step, stop_after) -> int:
    """The number of steps :func:`train` runs, after checking its arguments (one-line errors)."""
    if not isinstance(model, TinyLlama):
        raise KVLibError(f"model must be a kvlib TinyLlama, not {type(model).__name__}")
    if not isinstance(config, TrainConfig) or not isinstance(corpus, CorpusConfig):
        raise KVLibError("config must be a TrainConfig and corpus a CorpusConfig")
    if on_step is not None and not callable(on_step):
        raise KVLibError(f"on_step must be callable (step, loss), not {on_step!r}")
    if corpus.seq_len > model.config.max_seq_len:
        raise KVLibError(
            f"documents of {corpus.seq_len} tokens exceed the model's {model.config.max_seq_len}"
        )
    if model.config.vocab_size < len(VOCAB):
        raise KVLibError(
            f"the model's {model.config.vocab_size} embeddings miss corpus tokens ({len(VOCAB)})"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise KVLibError(
            "the model has no trainable parameter (load_model freezes them: requires_grad_(True))"
        )
    if stop_after is None:
        return config.num_steps
    if not is_int(stop_after) or not 1 <= stop_after <= config.num_steps:
        raise KVLibError(f"stop_after must be an integer in [1, {config.num_steps}], not {stop_after!r}")
    return stop_after
