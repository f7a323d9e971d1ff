"""Speculative decoding inside the real engine (chapter 8): the draft model's cache beside the target's.

:func:`kvlib.serving.engine.run_engine` decodes with :func:`speculator`'s result when it is
given a draft model: at each step, every decoding sequence gets from 1 to
``num_speculative_tokens + 1`` tokens from
:func:`kvlib.serving.speculative.speculative_decode` (the draft proposes, the target verifies
in one pass, rejected tokens roll back), never more than it still has to generate; the
scheduler (:meth:`kvlib.serving.scheduler.Scheduler.complete`) takes lists of tokens and
appends them (the slots of all but the last are already taken in the target's cache, whose
manager is the scheduler's memory: speculative slots count in the KV budget). The
draft keeps its own paged cache, one block for each of the target's; both come out of the
one budget (:func:`target_share`). A sequence leaves the draft's cache when it finishes or
is preempted (its draft K/V are rebuilt when it comes back).
"""

from __future__ import annotations

from kvlib import KVLibError
from kvlib.cache.contiguous import kv_bytes_per_token
from kvlib.checks import require_int
from kvlib.model.llama import TinyLlama
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.scheduler import SchedulerConfig
from kvlib.serving.types import SeqState


class Speculator:
    """Decodes a step's sequences speculatively: ``speculator(seqs)`` -> new tokens of each (a list each)."""

    def __init__(
        self, target: TinyLlama, draft: TinyLlama, k: int, cache: PagedKVCache, draft_cache: PagedKVCache
    ):
        self.target, self.draft, self.k = target, draft, k
        self.cache, self.draft_cache = cache, draft_cache  # the target's cache (the scheduler's), the draft's

    def __call__(self, seqs: list[SeqState]) -> list[list[int]]:
        """Each sequence's accepted tokens (1 to k + 1, at most what it still has to generate)."""
        from kvlib.serving.speculative import speculative_decode

        max_new = [s.request.output_len - s.num_generated for s in seqs]
        lengths = [len(s.tokens) for s in seqs]
        new = speculative_decode(self.target, self.draft, self.cache, self.draft_cache, seqs, self.k, max_new)
        for seq, length in zip(seqs, lengths, strict=True):
            del seq.tokens[length:]  # it appended them; the scheduler's complete() appends them again
        return new

    def forget(self, running: list[SeqState]) -> None:
        """Free the draft's K/V of every sequence that no longer runs (finished, preempted, swapped out)."""
        keep = {s.seq_id for s in running}
        for seq_id in [i for i in self.draft_cache.manager.sequences if i not in keep]:
            self.draft_cache.manager.free(seq_id)


def speculator(
    target: TinyLlama,
    draft: TinyLlama | None,
    num_speculative_tokens: int,
    cache: PagedKVCache,
    max_len: int,
    config: SchedulerConfig,
) -> Speculator | None:
    """The engine's speculative decoder, or ``None`` without a draft (plain greedy decoding).

    ``num_speculative_tokens`` (vLLM's ``num_speculative_tokens`` of ``--speculative-config``)
    must be >= 1 with a draft and 0 without one; the draft must share the target's vocabulary.
    """
    if draft is None:
        if num_speculative_tokens != 0:
            raise KVLibError(
                f"num_speculative_tokens={num_speculative_tokens!r} needs a draft model (draft=...)"
            )
        return None
    if not isinstance(draft, TinyLlama):
        raise KVLibError(f"draft must be a TinyLlama or None, not {type(draft).__name__}")
    k = require_int(num_speculative_tokens, "num_speculative_tokens (with a draft model)")
    if draft.config.vocab_size != target.config.vocab_size:
        raise KVLibError(
            f"the draft's vocabulary ({draft.config.vocab_size}) differs from the target's "
            f"({target.config.vocab_size})"
        )
    if draft.config.max_seq_len < max_len + k:
        raise KVLibError(
            f"the draft's max_seq_len {draft.config.max_seq_len} is below max_len + k = {max_len + k}"
        )
    # As many blocks as the target's cache: a sequence's draft K/V never outgrow its target K/V (the
    # draft lags the target's guesses by one token, and leaves a sequence that stops running), so
    # the draft never limits; target_share sized both caches from one budget.
    draft_cache = PagedKVCache.for_model(
        draft, cache.manager.num_blocks, cache.block_size, enable_prefix_caching=False
    )
    return Speculator(target, draft, k, cache, draft_cache)


def target_share(target: TinyLlama, draft: TinyLlama, num_slots: int, block_size: int) -> int:
    """The target's token slots when its cache and the draft's share a budget of ``num_slots`` target slots.

    The budget is ``num_slots`` x the target's bytes per token; every block of the target's cache
    comes with a block of the draft's (:func:`speculator`), so the target keeps the whole blocks of
    ``num_slots x t / (t + d)`` slots (``t``, ``d``: each model's bytes per token), as vLLM sizes a
    draft model's cache from the same GPU memory as the target's (chapter 8).
    """
    if not isinstance(draft, TinyLlama):
        raise KVLibError(f"draft must be a TinyLlama or None, not {type(draft).__name__}")
    target_bytes, draft_bytes = (
        kv_bytes_per_token(m.config, m.lm_head.weight.dtype) for m in (target, draft)
    )
    num_pairs = num_slots * target_bytes // ((target_bytes + draft_bytes) * block_size)
    return num_pairs * block_size
