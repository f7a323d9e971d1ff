"""Speculative decoding over the paged cache, with rollback of both caches (chapter 8).

A small *draft* model guesses the next ``k`` tokens of a sequence one at a time; the *target*
model scores all of them in ONE forward pass over ``k + 1`` positions (the newest token and
the ``k`` guesses), the way a prefill with a cached prefix computes several new tokens. The
target keeps the longest run of guesses that agree with its own greedy choices, plus its own
next token, so each pass yields 1 to ``k + 1`` tokens and the output is exactly plain greedy
decoding (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling";
vLLM's ``--speculative-config``).

On a paged cache the guesses need slots before the target's pass writes their K/V, and the
rejected ones must give them back: each guess gets a *speculative* slot
(``BlockManager.append_slot(speculative=True)``) in both caches, and ``BlockManager.accept``
keeps the accepted ones and releases the rest, freeing blocks only guesses had filled and
never publishing a guess in a prefix-cache hash (:mod:`kvlib.paged.block_manager`).

The sequences are :class:`~kvlib.serving.types.SeqState`: ``seq.tokens`` is the one token
list, which both caches' managers read. The draft cache follows the target lazily: at each
call it computes whatever of ``seq.tokens`` it lacks (the whole prompt the first time, one or
two tokens afterwards). Sequences are batched: every draft step is one pass over the
sequences still guessing, and the target verifies, in one pass each, all sequences with the
same number of guesses (usually all of them). The draft of chapter 8 is the target's own
first layers (:mod:`kvlib.chapters.ch08_serving_engines.speculative_bench`), which also measures acceptance
and speed-up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import num_blocks_for
from kvlib.paged.decode_loop import decode_step, give_slots, greedy, prefill
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.traces import Request
from kvlib.serving.types import SeqState


@dataclass(frozen=True)
class SpecStep:
    """What one call of :func:`speculative_step` did, for a batch of sequences."""

    new_tokens: list[list[int]]  # per sequence: the accepted guesses, then the target's own token
    num_proposed: list[int]  # per sequence: guesses the target verified
    num_accepted: list[int]  # per sequence: guesses it kept
    num_target_passes: int  # forward passes of the target (one per number of guesses in the batch)
    num_draft_passes: int  # forward passes of the draft (catching up, then one per guess)
    num_target_blocks: int  # blocks of the target cache in use at the step's peak (guesses slotted)
    num_draft_blocks: int  # blocks of the draft cache in use at the step's peak


def used_blocks(cache: PagedKVCache) -> int:
    """Blocks of a paged cache some sequence holds."""
    return cache.manager.num_blocks - cache.manager.num_free_blocks


def free_draft(draft_cache: PagedKVCache, seq: SeqState) -> None:
    """Release a finished request's draft blocks (the engine calls it when it frees the target's)."""
    if seq.seq_id in draft_cache.manager:
        draft_cache.manager.free(seq.seq_id)


def _check_step(target, draft, target_cache, draft_cache, seqs, k, max_new) -> list[int]:
    """The caps on new tokens per sequence, once every argument is checked (one-line errors)."""
    for name, model, cache in (("target", target, target_cache), ("draft", draft, draft_cache)):
        if not isinstance(model, TinyLlama) or not isinstance(cache, PagedKVCache):
            raise KVLibError(f"the {name} must be a kvlib TinyLlama with a PagedKVCache")
        if cache.num_layers != model.config.num_layers or cache.k.shape[3:] != (
            model.config.num_kv_heads,
            model.config.head_dim,
        ):
            raise KVLibError(f"the {name} cache is not shaped for the {name} model")
    if target_cache is draft_cache:
        raise KVLibError("the target and the draft need caches of their own")
    if draft.config.vocab_size != target.config.vocab_size:
        raise KVLibError(f"draft vocabulary {draft.config.vocab_size} != target's {target.config.vocab_size}")
    k = require_int(k, "k", 0)
    if not seqs or not all(isinstance(s, SeqState) for s in seqs):
        raise KVLibError("seqs must be a non-empty list of SeqState")
    manager = target_cache.manager
    for seq in seqs:
        if seq.seq_id not in manager or manager.num_tokens(seq.seq_id) != len(seq.tokens):
            raise KVLibError(f"sequence {seq.seq_id}: its newest token must hold a slot in the target cache")
        if manager.num_computed(seq.seq_id) != len(seq.tokens) - 1 or manager.num_speculative(seq.seq_id):
            raise KVLibError(f"sequence {seq.seq_id}: only its newest token may lack K/V in the target cache")
    if max_new is None:
        return [k + 1] * len(seqs)
    if len(max_new) != len(seqs):
        raise KVLibError(f"max_new has {len(max_new)} entries for {len(seqs)} sequences")
    return [min(k + 1, require_int(m, "max_new")) for m in max_new]


def _forward(model: TinyLlama, cache: PagedKVCache, seq_ids, rows, last_only: bool) -> torch.Tensor:
    """One forward pass of ``model`` over ``rows`` (equal lengths), the tokens each sequence lacks K/V for."""
    cache.schedule(seq_ids)
    return model(torch.tensor(rows, device=cache.k.device), cache, last_only=last_only)


def _draft_catch_up(draft_cache: PagedKVCache, seq: SeqState) -> bool:
    """Slots in the draft cache for every token of ``seq.tokens``; False if the draft cache is full."""
    manager, seq_id = draft_cache.manager, seq.seq_id
    entry = manager.sequences.get(seq_id)
    if entry is not None and (entry.token_ids is not seq.tokens or entry.num_tokens > len(seq.tokens)):
        manager.free(seq_id)  # another list under the same id: start again
        entry = None
    if entry is None:
        return manager.allocate(seq_id, seq.tokens) is not None
    while manager.num_tokens(seq_id) < len(seq.tokens):
        if manager.append_slot(seq_id) is None:
            return False
    return True


def _propose(draft, draft_cache, seqs, num_guesses: list[int]) -> int:
    """Append up to ``num_guesses[i]`` greedy draft tokens to each ``seqs[i].tokens``; returns draft passes.

    Each guess but the last gets a speculative draft slot (the last one's K/V are never needed
    unless it is accepted, and then the next call computes them).
    """
    manager, passes = draft_cache.manager, 0
    ready = [i for i, n in enumerate(num_guesses) if n > 0 and _draft_catch_up(draft_cache, seqs[i])]
    by_pending = defaultdict(list)  # tokens the draft lacks K/V for -> sequences
    for i in ready:
        by_pending[len(seqs[i].tokens) - manager.num_computed(seqs[i].seq_id)].append(i)
    for group in by_pending.values():
        rows = [seqs[i].tokens[manager.num_computed(seqs[i].seq_id) :] for i in group]
        logits = _forward(draft, draft_cache, [seqs[i].seq_id for i in group], rows, True)[:, -1]
        for i, token in zip(group, greedy(logits), strict=True):
            seqs[i].tokens.append(token)
        passes += 1
    active, made = ready, dict.fromkeys(ready, 1)
    while active := [i for i in active if made[i] < num_guesses[i]]:
        active = [i for i in active if manager.append_slot(seqs[i].seq_id, speculative=True) is not None]
        if not active:
            break
        ids, lists = [seqs[i].seq_id for i in active], [seqs[i].tokens for i in active]
        for i, token in zip(active, greedy(decode_step(draft, draft_cache, ids, lists, False)), strict=True):
            seqs[i].tokens.append(token)
            made[i] += 1
        passes += 1
    return passes


def _verify(target, target_cache, seqs, lengths) -> tuple[list[list[int]], int]:
    """The target's greedy token after the newest token and after each slotted guess; and its passes.

    Guesses get speculative target slots first (those without one are dropped); sequences with
    the same number of guesses share one pass over ``guesses + 1`` positions.
    """
    manager, by_len = target_cache.manager, defaultdict(list)
    for i, seq in enumerate(seqs):
        while manager.num_tokens(seq.seq_id) < len(seq.tokens):
            if manager.append_slot(seq.seq_id, speculative=True) is None:
                break
        by_len[manager.num_tokens(seq.seq_id) - lengths[i] + 1].append(i)
    choices: list[list[int]] = [[] for _ in seqs]
    for num_new, group in by_len.items():
        rows = [seqs[i].tokens[lengths[i] - 1 : lengths[i] - 1 + num_new] for i in group]
        logits = _forward(target, target_cache, [seqs[i].seq_id for i in group], rows, False)
        for i, row in zip(group, logits.argmax(dim=-1).tolist(), strict=True):
            choices[i] = row
    return choices, len(by_len)


@torch.inference_mode()
def speculative_step(
    target: TinyLlama,
    draft: TinyLlama,
    target_cache: PagedKVCache,
    draft_cache: PagedKVCache,
    seqs: Sequence[SeqState],
    k: int,
    max_new: Sequence[int] | None = None,
) -> SpecStep:
    """:func:`speculative_decode`, with what it counted (guesses, passes, blocks at the peak)."""
    seqs = list(seqs)
    caps = _check_step(target, draft, target_cache, draft_cache, seqs, k, max_new)
    lengths = [len(seq.tokens) for seq in seqs]  # L: the newest token is at L - 1
    room = min(target.config.max_seq_len, draft.config.max_seq_len)  # positions L .. L + guesses - 1 fit
    num_guesses = [max(0, min(cap - 1, room - n)) for cap, n in zip(caps, lengths, strict=True)]
    num_draft_passes = _propose(draft, draft_cache, seqs, num_guesses)
    num_draft_blocks = used_blocks(draft_cache)
    choices, num_target_passes = _verify(target, target_cache, seqs, lengths)
    num_target_blocks = used_blocks(target_cache)
    new_tokens, proposed, accepted = [], [], []
    for seq, length, choice in zip(seqs, lengths, choices, strict=True):
        guesses = seq.tokens[length : length + len(choice) - 1]
        kept = 0
        while kept < len(guesses) and guesses[kept] == choice[kept]:
            kept += 1
        target_cache.manager.accept(seq.seq_id, kept)  # the slots first, then the list
        if seq.seq_id in draft_cache.manager:
            draft_cache.manager.accept(seq.seq_id, min(kept, draft_cache.manager.num_speculative(seq.seq_id)))
        del seq.tokens[length + kept :]
        seq.tokens.append(choice[kept])
        new_tokens.append(seq.tokens[length:])
        proposed.append(len(guesses))
        accepted.append(kept)
    return SpecStep(
        new_tokens,
        proposed,
        accepted,
        num_target_passes,
        num_draft_passes,
        num_target_blocks,
        num_draft_blocks,
    )


def speculative_decode(
    target: TinyLlama,
    draft: TinyLlama,
    target_cache: PagedKVCache,
    draft_cache: PagedKVCache,
    seqs: Sequence[SeqState],
    k: int,
    max_new: Sequence[int] | None = None,
) -> list[list[int]]:
    """One speculative round for each sequence: the 1 to ``k + 1`` new tokens it accepted (greedy).

    Each ``seq.tokens`` ends with its newest token, which holds a slot in ``target_cache``
    without K/V yet (the scheduler's memory gave it one). Returns per sequence the accepted
    guesses and the target's own next token, at most ``max_new[i]`` of them, and appends
    them to ``seq.tokens``: afterwards the target cache holds the K/V of every new token but
    the last, which has no slot, exactly as after that many plain decode steps (the caller
    must not append them again). The draft cache holds K/V of a prefix of ``seq.tokens``;
    call :func:`free_draft` when a request leaves.
    """
    return speculative_step(target, draft, target_cache, draft_cache, seqs, k, max_new).new_tokens


@dataclass(frozen=True)
class SpecRun:
    """Result of :func:`generate_speculative`: one prompt decoded speculatively."""

    tokens: list[int]  # prompt, then the generated tokens
    num_new: int  # tokens generated
    k: int  # guesses per round
    num_proposed: int  # guesses the target verified
    num_accepted: int  # guesses it kept
    num_target_passes: int  # the prefill and one verification per round
    num_draft_passes: int  # the draft's passes (its prefill included)
    num_target_blocks: int  # most blocks the target cache held at once
    num_draft_blocks: int  # most blocks the draft cache held at once
    kv_bytes: int  # both peaks in bytes: what the two caches take of the memory budget

    @property
    def acceptance_rate(self) -> float:
        """Share of the guesses the target kept (0 when none were made)."""
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """Generated tokens per target forward pass (1 for plain decoding: prefill, then one per token)."""
        return self.num_new / self.num_target_passes


def standalone_caches(
    target: TinyLlama, draft: TinyLlama, num_tokens: int, k: int, block_size: int
) -> tuple[PagedKVCache, PagedKVCache]:
    """A target and a draft cache, each with the blocks of ``num_tokens`` tokens and one round of guesses."""
    num_blocks = num_blocks_for(num_tokens + k, block_size)
    return (
        PagedKVCache.for_model(target, num_blocks, block_size),
        PagedKVCache.for_model(draft, num_blocks, block_size),
    )


@torch.inference_mode()
def generate_speculative(
    target: TinyLlama, draft: TinyLlama, prompt: Sequence[int], num_new: int, k: int, block_size: int = 16
) -> SpecRun:
    """Greedy decoding of ``num_new`` tokens after ``prompt`` by speculative rounds of ``k`` guesses.

    The target prefills the prompt (its first token), then each round gives the newest token
    a slot and calls :func:`speculative_step`. The tokens equal plain greedy decoding
    (:func:`kvlib.paged.decode_loop.generate_paged`).
    """
    num_new, k = require_int(num_new, "num_new"), require_int(k, "k", 0)
    request = Request(0, 0.0, tuple(prompt), num_new)  # checks the prompt's token ids
    if len(prompt) + num_new > min(target.config.max_seq_len, draft.config.max_seq_len):
        raise KVLibError(f"{len(prompt)} + {num_new} tokens exceed the models' max_seq_len")
    if max(prompt) >= target.config.vocab_size:
        raise KVLibError(f"token id {max(prompt)} is outside the vocabulary of {target.config.vocab_size}")
    target_cache, draft_cache = standalone_caches(target, draft, len(prompt) + num_new, k, block_size)
    seq = SeqState(request, list(prompt))
    allocation = target_cache.manager.allocate(0, seq.tokens)
    seq.tokens.append(
        int(prefill(target, target_cache, 0, seq.tokens, allocation.num_cached_tokens).argmax())
    )
    steps = []
    while len(seq.generated) < num_new:
        give_slots(target_cache, [0])
        cap = [num_new - len(seq.generated)]
        steps.append(speculative_step(target, draft, target_cache, draft_cache, [seq], k, cap))
    num_target_blocks = max([used_blocks(target_cache)] + [s.num_target_blocks for s in steps])
    num_draft_blocks = max([0] + [s.num_draft_blocks for s in steps])
    return SpecRun(
        tokens=seq.tokens,
        num_new=num_new,
        k=k,
        num_proposed=sum(s.num_proposed[0] for s in steps),
        num_accepted=sum(s.num_accepted[0] for s in steps),
        num_target_passes=1 + sum(s.num_target_passes for s in steps),
        num_draft_passes=sum(s.num_draft_passes for s in steps),
        num_target_blocks=num_target_blocks,
        num_draft_blocks=num_draft_blocks,
        kv_bytes=num_target_blocks * target_cache.bytes_per_block
        + num_draft_blocks * draft_cache.bytes_per_block,
    )
