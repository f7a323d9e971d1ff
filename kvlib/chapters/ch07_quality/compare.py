"""Each lossy lever of chapter 7 applied to the trained model: quantized K/V, fewer K/V heads, eviction.

Every function reads the same :class:`~kvlib.train.corpus.Documents` and returns a
:class:`~kvlib.quality.score.Quality` (against the full cache's logits, ``reference``) with the
KV bytes the lever keeps per token of context, so that chapter 7 can set every method on one
axis. Bytes are counted as an engine would store the reference cache, in fp16 (2 bytes per
value), at the end of a document of ``seq_len`` tokens; the model computes in float32 either way.

- :func:`full_cache`: the reference, one prefill over the whole document (no cache: the
  logits are the same for every cache that keeps everything exactly).
- :func:`quantized`: :class:`~kvlib.cache.quantized.QuantizedKVCache` in a format of
  :mod:`kvlib.quant.formats`, fed in steps of ``step_len`` tokens so that KIVI's residual of
  recent tokens behaves as in decoding at that granularity.
- :func:`fewer_heads`: the model itself converted to fewer K/V heads
  (:func:`~kvlib.model.head_pooling.pool_kv_heads`), or an uptrained one loaded from a file.
- :func:`evicted`: :class:`~kvlib.cache.evicting_cache.EvictingKVCache` under a policy of
  :mod:`kvlib.cache.eviction_policies` at a token budget, a prompt of ``budget`` tokens (nothing is
  evicted yet) then one token per step, as in decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.cache.evicting_cache import EvictingKVCache
from kvlib.cache.eviction_policies import eviction_policy
from kvlib.cache.quantized import QuantizedKVCache
from kvlib.checks import is_int
from kvlib.model.head_pooling import pool_kv_heads
from kvlib.model.llama import TinyLlama
from kvlib.quality.score import Quality, logits_in_steps, score_logits
from kvlib.quant.formats import kv_quant_format
from kvlib.sizing.spec import kv_cache_bytes
from kvlib.train.corpus import Documents
from kvlib.train.trainer import WholeSequence

FP16_BYTES = 2  # bytes per stored value of the reference cache


@dataclass(frozen=True)
class LeverResult:
    """One method at one setting: what it keeps and what it costs."""

    method: str  # e.g. "int4 (g16)", "GQA-2 mean-pooled", "H2O"
    setting: str  # the knob's value, e.g. "group 16", "2 KV heads", "budget 128"
    kv_bytes_per_token: float  # KV bytes held per token of context at the end of a document
    quality: Quality  # against the full cache's logits


def fp16_bytes_per_token(model: TinyLlama) -> int:
    """The full cache's bytes per token in fp16, for the trained model: chapter 2's formula
    (:func:`kvlib.sizing.spec.kv_cache_bytes`) at one token."""
    c = model.config
    return kv_cache_bytes(c.num_layers, c.num_kv_heads, c.head_dim, seq_len=1, dtype_bytes=FP16_BYTES)


def _check_model_and_documents(model: TinyLlama, docs: Documents) -> None:
    """One-line :class:`~kvlib.KVLibError` unless ``model`` can read ``docs`` (every lever checks this)."""
    if not isinstance(model, TinyLlama):
        raise KVLibError(f"model must be a kvlib TinyLlama, not {type(model).__name__}")
    if not isinstance(docs, Documents):
        raise KVLibError(f"docs must be kvlib.train.corpus.Documents, not {type(docs).__name__}")
    seq, c = docs.tokens.shape[1], model.config
    if seq > c.max_seq_len:
        raise KVLibError(f"documents of {seq} tokens exceed the model's context of {c.max_seq_len}")
    if int(docs.tokens.max()) >= c.vocab_size or int(docs.tokens.min()) < 0:
        raise KVLibError(f"token ids must be in [0, {c.vocab_size}), the model's vocabulary")


def whole_pass(model: TinyLlama, tokens: torch.Tensor) -> torch.Tensor:
    """Logits (batch, seq, vocab) of whole documents in one pass, by PyTorch's fused causal attention.

    The same logits as ``model(tokens)`` up to float rounding, five times faster at 32 x 512
    tokens than the explicit softmax of :func:`~kvlib.model.attention.grouped_attention`, whose
    (batch, heads, seq, seq) scores dominate a whole-document pass.
    """
    with torch.inference_mode():
        return model(tokens, WholeSequence(*tokens.shape, device=tokens.device))


def full_cache(model: TinyLlama, docs: Documents) -> tuple[LeverResult, torch.Tensor]:
    """The reference: the whole document in one pass; returns the result and its logits."""
    _check_model_and_documents(model, docs)
    logits = whole_pass(model, docs.tokens)  # (batch, seq, vocab)
    result = LeverResult(
        "full cache", "fp16", fp16_bytes_per_token(model), score_logits(logits, docs, logits)
    )
    return result, logits


def quantized(
    model: TinyLlama,
    docs: Documents,
    reference: torch.Tensor,
    name: str,
    group_size: int | None = None,
    residual_length: int | None = None,
    step_len: int = 32,
) -> LeverResult:
    """The model through a :class:`QuantizedKVCache` in format ``name`` (see :func:`kv_quant_format`)."""
    _check_model_and_documents(model, docs)
    if not is_int(step_len) or step_len < 1:
        raise KVLibError(f"step_len must be a positive integer, not {step_len!r}")
    fmt = kv_quant_format(name, group_size, residual_length)
    batch, seq = docs.tokens.shape
    cache = QuantizedKVCache(model.config, batch, seq, fmt)
    logits = logits_in_steps(model, docs.tokens, cache, min(step_len, seq), step_len)
    c = model.config
    per_token = c.num_layers * c.num_kv_heads * fmt.context_bytes(seq, c.head_dim, FP16_BYTES) / seq
    setting = f"group {fmt.group_size or c.head_dim}"
    if fmt.residual_length:
        setting += f", residual {fmt.residual_length}"
    return LeverResult(name, setting, per_token, score_logits(logits, docs, reference))


def fewer_heads(
    model: TinyLlama, docs: Documents, reference: torch.Tensor, label: str, num_kv_heads=None, method="mean"
) -> LeverResult:
    """``model`` pooled to ``num_kv_heads`` K/V heads by ``method`` (None: ``model`` as it is)."""
    _check_model_and_documents(model, docs)
    converted = model if num_kv_heads is None else pool_kv_heads(model, num_kv_heads, method)
    logits = whole_pass(converted, docs.tokens)
    heads = converted.config.num_kv_heads
    return LeverResult(
        label, f"{heads} KV heads", fp16_bytes_per_token(converted), score_logits(logits, docs, reference)
    )


def evicted(
    model: TinyLlama, docs: Documents, reference: torch.Tensor, policy: str, budget: int
) -> LeverResult:
    """The model through an :class:`EvictingKVCache` keeping ``budget`` tokens by ``policy``."""
    _check_model_and_documents(model, docs)
    batch, seq = docs.tokens.shape
    cache = EvictingKVCache(model.config, batch, eviction_policy(policy, budget), max_len=seq)
    logits = logits_in_steps(model, docs.tokens, cache, min(budget, seq), 1)
    per_token = fp16_bytes_per_token(model) * min(budget, seq) / seq
    return LeverResult(policy, f"budget {budget}", per_token, score_logits(logits, docs, reference))
