"""Perplexity, probe recall and token agreement of a model reading documents through a cache (chapter 7).

Every lossy lever of chapter 7 is judged the same way: the trained model reads the same
validation documents (:func:`kvlib.train.corpus.documents`) teacher-forced, through the cache
under test, and :func:`score_logits` turns the logits of every position into

- **perplexity**: exp of the mean cross-entropy of every next token (all positions);
- **probe recall**: how often the most likely token after ``? KEY`` is the fact's ``VALUE``,
  for the queries late in the document (the register lies 350+ tokens back);
- **agreement**: how often the most likely next token equals the full cache's (the greedy
  choice, position by position; 1.0 for the reference itself).

:func:`logits_in_steps` feeds a cache the documents in steps of ``step_len`` tokens after a
prompt of ``prompt_len``, as generation would, and stacks the logits of every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.model.config import KVCache
from kvlib.model.llama import TinyLlama
from kvlib.train.corpus import Documents


@dataclass(frozen=True)
class Quality:
    """How well a model predicts the documents through one cache."""

    perplexity: float  # exp(mean next-token cross-entropy over every position); inf if it overflows
    probe_recall: float  # fraction of late queries answered with the right VALUE (greedy); nan if none
    num_probes: int  # late queries scored
    agreement: float  # fraction of positions whose greedy next token equals the reference's


def logits_in_steps(
    model: TinyLlama, tokens: torch.Tensor, cache: KVCache, prompt_len: int, step_len: int = 1
) -> torch.Tensor:
    """Logits (batch, seq, vocab) of every position, fed to ``cache`` as a prompt then in steps.

    The cache must start empty (a cache that already holds tokens would shift every position);
    the last step is shorter when ``step_len`` does not divide ``seq - prompt_len``.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
        raise KVLibError(f"tokens must be a (batch, seq) tensor of ids, not {_describe(tokens)}")
    batch, seq = tokens.shape
    for name, value in (("prompt_len", prompt_len), ("step_len", step_len)):
        require_int(value, name, low=None)
    if not 1 <= prompt_len <= seq or step_len < 1:
        raise KVLibError(f"prompt_len must be 1 .. {seq} and step_len positive, not {prompt_len}, {step_len}")
    if getattr(cache, "length", 0):
        raise KVLibError(f"the cache must start empty, not holding {cache.length} tokens per sequence")
    with torch.inference_mode():
        chunks = [model(tokens[:, :prompt_len], cache)]  # (batch, prompt_len, vocab)
        for start in range(prompt_len, seq, step_len):
            chunks.append(model(tokens[:, start : start + step_len], cache))  # (batch, step, vocab)
    return torch.cat(chunks, dim=1)


def score_logits(logits: torch.Tensor, docs: Documents, reference: torch.Tensor | None = None) -> Quality:
    """:class:`Quality` of ``logits`` (batch, seq, vocab) on ``docs``; agreement against ``reference``.

    ``reference`` (the full cache's logits) must have the shape of ``logits``; without one the
    agreement is 1.0 (the logits are their own reference).
    """
    tokens = _check_scored(logits, docs, reference)
    predicted, targets = logits[:, :-1].float(), tokens[:, 1:]  # position t predicts token t + 1
    loss = F.cross_entropy(predicted.reshape(-1, predicted.shape[-1]), targets.reshape(-1))
    greedy = predicted.argmax(-1)  # (batch, seq - 1)
    probes = docs.probe_mask[:, 1:]  # (batch, seq - 1): True where the target is a late VALUE
    num_probes = int(probes.sum())
    recall = float((greedy[probes] == targets[probes]).float().mean()) if num_probes else math.nan
    agreement = 1.0
    if reference is not None:
        agreement = float((greedy == reference[:, :-1].argmax(-1)).float().mean())
    nats = float(loss)  # nan stays nan (non-finite logits); beyond 709, exp overflows a float
    perplexity = math.inf if nats > 709 else math.exp(nats)
    return Quality(perplexity, recall, num_probes, agreement)


def _check_scored(logits, docs, reference) -> torch.Tensor:
    """The documents' tokens, after checking that logits, masks and reference fit them (one-line errors)."""
    if not isinstance(docs, Documents):
        raise KVLibError(f"docs must be kvlib.train.corpus.Documents, not {type(docs).__name__}")
    tokens = docs.tokens
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        raise KVLibError(f"logits must be a (batch, seq, vocab) float tensor, not {_describe(logits)}")
    if logits.shape[:2] != tokens.shape:
        raise KVLibError(f"logits {tuple(logits.shape[:2])} do not match documents {tuple(tokens.shape)}")
    if tokens.shape[1] < 2:
        raise KVLibError("documents of one token have no next token to score")
    if docs.probe_mask.shape != tokens.shape:
        raise KVLibError(
            f"probe_mask {tuple(docs.probe_mask.shape)} does not match tokens {tuple(tokens.shape)}"
        )
    if int(tokens.min()) < 0 or int(tokens.max()) >= logits.shape[-1]:
        raise KVLibError(f"token ids must be in [0, {logits.shape[-1]}), the logits' vocabulary")
    if reference is not None and (not isinstance(reference, torch.Tensor) or reference.shape != logits.shape):
        raise KVLibError(
            f"reference {_describe(reference)} must have the logits' shape {tuple(logits.shape)}"
        )
    return tokens


def _describe(value) -> str:
    """A tensor's shape and dtype, or another value's type, for an error message."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype}"
    return type(value).__name__
