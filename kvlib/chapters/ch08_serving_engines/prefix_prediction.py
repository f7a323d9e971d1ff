"""Prefix caching predicted (chapter 8, "Serving as engines do it now"): what a shared prefix saves.

With ``--enable-prefix-caching`` vLLM keeps the K/V of every full block under a hash of its
tokens and of all the tokens before it; a request whose prompt starts with blocks already
cached reuses them (chapter 3's :class:`~kvlib.paged.block_manager.BlockManager` does the
same). Two things get cheaper, and only two:

1. **Prefill.** The cached tokens are not computed again: each saves ``2 x parameters``
   FLOPs (``per_prefill_s`` of :func:`~kvlib.serving.roofline.roofline_step_model`,
   82 us per token for OPT-13B on the A100). In the book's step model a step takes the larger
   of its memory time and its compute time, so that saving shortens only a step whose compute
   outweighs its reads: a short prompt beside memory-bound decodes costs nothing to begin with.
   Decoding does not get cheaper at all: every output token still reads the K/V of the whole
   context, shared blocks included.
2. **Memory.** A shared block is stored once for every request that uses it, so more
   requests fit in the KV budget; where memory, not ``max_num_seqs``, limits the batch,
   the batch grows and each step's fixed cost (reading the weights) is split more ways.

:func:`predicted_gain` turns this into numbers for one kind of request, and
:func:`predict_trace` for a trace's lengths; :mod:`kvlib.chapters.ch08_serving_engines.prefix_simulation`
runs the
simulator with the cache off and on and sets the two side by side (its ``gain_table`` and
``eviction_table``).

Why users report "no gain" (each visible in the tables):

- **A short shared part.** Only whole blocks are cached (16 tokens by default), and the
  last prompt token is always computed (its logits choose the first output token): a
  system prompt of 15 tokens caches nothing, one of 100 tokens before a 1,000-token
  question saves under 10 % of that prefill.
- **Long outputs.** A request's time is mostly decode steps, which caching does not touch,
  and a short prompt's prefill rides on a decode step's memory reads: even a fully cached
  prompt saves little compute, unless the shared blocks also let the batch grow (point 2):
  measure with a budget as tight as production's, or the memory half of the gain is missed.
- **Eviction.** Freed cached blocks are reused until evicted, least recently freed first.
  When more distinct prefixes are in use (tenants, conversations) than the budget holds
  beside the running requests, a prefix is evicted between two of its requests and
  computed again: the hit rate, and with it the gain, falls (``eviction_table``).

The prediction assumes every shared block is a hit, each prompt prefilled in a step of its own,
and no preemption; the simulation has none of these simplifications, which is why the two are
set side by side rather than equated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvlib import KVLibError
from kvlib.checks import require_int, require_real
from kvlib.serving.roofline import kv_budget, roofline_step_model
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import Request


@dataclass(frozen=True)
class PrefixGain:
    """What prefix caching saves for requests of given lengths, predicted from a step-time model."""

    shared_len: int  # tokens every prompt shares (its system prompt)
    mean_prompt_len: float  # prompt tokens per request, the shared part included
    mean_output_len: float  # output tokens per request
    mean_cached_len: float  # prompt tokens per request a hit skips: whole blocks, the last token excluded
    batch_without: float  # sequences per step without caching (memory or max_num_seqs)
    batch_with: float  # sequences per step with caching: shared blocks stored once
    prefill_share_saved: float  # share of the GPU time per output token saved at the batch of batch_without
    memory_saved_share: float  # share of the KV slots the running requests need, saved by sharing
    throughput_ratio: float  # output tokens per second, with caching over without (batch growth included)

    @property
    def shared_fraction(self) -> float:
        """Mean share of a prompt that a hit skips."""
        return self.mean_cached_len / self.mean_prompt_len


def prefix_hit_tokens(shared_len, prompt_len, block_size: int = 16):
    """Prompt tokens a prefix-cache hit skips: the shared part's whole blocks, at most
    ``(prompt_len - 1) // block_size`` blocks (the last prompt token is always computed)."""
    shared, prompt = np.asarray(shared_len), np.asarray(prompt_len)
    return np.minimum(shared // block_size, (prompt - 1) // block_size) * block_size


def admissions_per_step(prompt, max_prefill_tokens: int = 2048) -> float:
    """Prompts admitted per step while requests queue: the prompts, in order, packed into steps of at
    most ``max_prefill_tokens`` tokens (:class:`~kvlib.serving.scheduler.SchedulerConfig`'s
    ``max_prefill_tokens``: a cached prefix counts too), the first of a step always fitting."""
    num_steps, left = 0, 0
    for length in np.asarray(prompt).tolist():
        if num_steps == 0 or length > left:
            num_steps, left = num_steps + 1, max_prefill_tokens
        left -= length
    return len(prompt) / num_steps


def _batch(num_slots: float, held: float, cap: float) -> float:
    """Sequences that fit: the slots over what one running request holds, at most ``cap``."""
    if num_slots <= held:
        raise KVLibError(f"a budget of {num_slots:,.0f} slots holds no request of {held:,.0f} tokens")
    return min(cap, num_slots / held)


def _prediction(
    prompt, cached, output, shared_len, step_model, num_slots, block_size, max_num_seqs, num_prefixes
) -> PrefixGain:
    """The arithmetic of :func:`predicted_gain`, over arrays of lengths, (requests,) each.

    A request runs ``O`` steps (the prefill makes its first token) holding ``P + k`` tokens at its
    k-th, ``P + (O + 1) / 2`` on average (plus half a block, its last block's empty slots); the
    running requests are those lengths weighted by how many steps each stays, ``O``. With sharing
    it holds ``C`` fewer slots of its own, and the ``num_prefixes`` shared parts are stored once
    (if they do not fit beside more requests than without, no memory is shared). The batch is the
    smallest of: the slots over a request's, ``max_num_seqs``, and the admissions per step times
    the steps a request stays (Little's law; short outputs leave faster than prompts come in).
    Serving them all takes ``sum(O) / batch`` steps, each timed by the step model's own
    :meth:`~kvlib.serving.step_time.StepTimeModel.predict` (so an overlapped model takes the larger
    of a step's memory and compute parts): every step decodes ``batch`` sequences and reads the
    K/V of their contexts (``(O - 1) (P + O / 2)`` per request over all its steps: decoding reads
    the shared blocks too); the prompts, in order, are prefilled in as many of those steps as
    there are requests (one prompt each) or, with fewer steps than requests, spread over all of
    them. A prompt computes ``P`` tokens without caching, ``P - C`` with it. For a summed model
    this is the sum of every step's parts, whatever the prompts' spread.
    """
    weights = output / output.sum()
    held_without = float(weights @ (prompt + (output + 1) / 2)) + block_size / 2
    held_with = held_without - float(weights @ cached)
    stored_shared = num_prefixes * int(prefix_hit_tokens(shared_len, shared_len + 1, block_size))
    # Little's law: a request stays O steps, and admissions_per_step() join per step at most
    cap = min(float(max_num_seqs), admissions_per_step(prompt) * float(output.mean()))
    batch_without = _batch(num_slots, held_without, cap)
    batch_with = min(cap, (num_slots - stored_shared) / held_with)
    if batch_with <= batch_without:  # the prefixes do not fit beside more requests: no memory shared
        batch_with, stored_shared, held_with = batch_without, 0, held_without
    reads = float(((output - 1) * (prompt + output / 2)).sum())  # K/V tokens read over the whole run

    def seconds(batch: float, computed) -> float:
        steps = float(output.sum()) / batch
        context = reads / steps  # K/V tokens one step reads
        admitting = min(len(computed), max(1, math.floor(steps)))  # steps that prefill prompts
        prefills = np.array([part.sum() for part in np.array_split(computed, admitting)])  # (admitting,)
        # the steps without a prompt (negative only when the run is under one step: the sum stays exact)
        plain = (steps - admitting) * float(step_model.predict(batch, context, 0))
        return plain + float(step_model.predict(batch, context, prefills).sum())

    without = seconds(batch_without, prompt)
    return PrefixGain(
        shared_len=int(shared_len),
        mean_prompt_len=float(prompt.mean()),
        mean_output_len=float(output.mean()),
        mean_cached_len=float(cached.mean()),
        batch_without=batch_without,
        batch_with=batch_with,
        prefill_share_saved=1 - seconds(batch_without, prompt - cached) / without,
        memory_saved_share=1 - (batch_with * held_with + stored_shared) / (batch_with * held_without),
        throughput_ratio=without / seconds(batch_with, prompt - cached),
    )


def step_model_and_budget(step_model, num_slots) -> tuple[StepTimeModel, int]:
    """``step_model`` and ``num_slots``, checked, or chapter 4's: the A100 OPT-13B roofline and its budget."""
    step_model = roofline_step_model() if step_model is None else step_model
    if not isinstance(step_model, StepTimeModel):
        raise KVLibError(f"step_model must be a StepTimeModel, not {type(step_model).__name__}")
    return step_model, kv_budget().num_slots if num_slots is None else require_int(num_slots, "num_slots")


def predicted_gain(
    shared_fraction: float,
    prompt_len: int,
    output_len: int,
    step_model: StepTimeModel | None = None,
    num_slots: int | None = None,
    block_size: int = 16,
    max_num_seqs: int = 256,
) -> PrefixGain:
    """What caching ``shared_fraction`` of every prompt saves, for requests of one length, in a
    saturated server (chapter 8).

    Defaults: the A100 OPT-13B roofline step model and its KV budget (chapter 4). The shared
    part is ``round(shared_fraction x prompt_len)`` tokens, of which only whole blocks are
    cached. ``prefill_share_saved`` is the compute half of the gain alone (the same batch);
    ``throughput_ratio`` adds the memory half (shared blocks stored once, a bigger batch).
    """
    if not 0 <= require_real(shared_fraction, "shared_fraction") <= 1:
        raise KVLibError(f"shared_fraction is a share of the prompt in [0, 1], not {shared_fraction!r}")
    prompt_len, output_len = require_int(prompt_len, "prompt_len"), require_int(output_len, "output_len")
    block_size = require_int(block_size, "block_size")
    step_model, num_slots = step_model_and_budget(step_model, num_slots)
    shared = round(shared_fraction * prompt_len)
    prompt, output = np.full(256, prompt_len), np.full(256, output_len)  # (256,): a queue of such requests
    cached = prefix_hit_tokens(shared, prompt, block_size)
    return _prediction(
        prompt,
        cached,
        output,
        shared,
        step_model,
        num_slots,
        block_size,
        require_int(max_num_seqs, "max_num_seqs"),
        1,
    )


def predict_trace(
    requests: list[Request],
    shared_len: int,
    step_model: StepTimeModel | None = None,
    num_slots: int | None = None,
    block_size: int = 16,
    max_num_seqs: int = 256,
    num_prefixes: int = 1,
) -> PrefixGain:
    """:func:`predicted_gain` over a trace's own lengths, each prompt starting with a shared
    part of ``shared_len`` tokens (one of ``num_prefixes`` distinct ones, each stored once)."""
    if not requests or not all(isinstance(r, Request) for r in requests):
        raise KVLibError("predict_trace needs a non-empty list of Request")
    step_model, num_slots = step_model_and_budget(step_model, num_slots)
    shared_len, block_size = (
        require_int(shared_len, "shared_len", 0),
        require_int(block_size, "block_size"),
    )
    prompt = np.array([r.prompt_len for r in requests])  # (requests,)
    output = np.array([r.output_len for r in requests])  # (requests,)
    if shared_len > prompt.min():
        raise KVLibError(
            f"shared_len {shared_len} is longer than the shortest prompt ({prompt.min()} tokens)"
        )
    cached = prefix_hit_tokens(shared_len, prompt, block_size)
    max_num_seqs, num_prefixes = (
        require_int(max_num_seqs, "max_num_seqs"),
        require_int(num_prefixes, "num_prefixes"),
    )
    return _prediction(
        prompt, cached, output, shared_len, step_model, num_slots, block_size, max_num_seqs, num_prefixes
    )
