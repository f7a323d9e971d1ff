"""The paged decode loop: prefill and decode steps on a :class:`PagedKVCache`, and generators (chapter 3).

Every caller that runs ``kvlib.model`` on the paged cache goes through two functions:

- :func:`prefill`: one sequence's prompt, past the tokens the prefix cache already holds;
- :func:`decode_step`: one token for each sequence of a batch: the newest token of each
  gets a slot, the model runs on them in one forward pass, and their logits come back;
  :func:`greedy_step` picks the most likely next tokens from them, allocating no tensor.

Each sequence's tokens have one owner, the caller: it appends every new token to its own
list, which the block manager only reads (see :mod:`kvlib.paged.block_manager`). On top of
the two steps, chapter 3's generators: :func:`generate_paged` (greedy, prompts of
different lengths in one batch) and :func:`decode_branches` (one prompt forked into
branches that share its blocks, copy-on-write). Chapter 4's beam search
(:mod:`kvlib.chapters.ch04_serving.sharing`) and serving engine (:mod:`kvlib.serving.engine`) use the
same two steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import are_token_ids, require_int
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import Allocation, num_blocks_for
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.paged.usage import BlockSnapshot, block_snapshot


@torch.inference_mode()
def prefill(
    model: TinyLlama,
    cache: PagedKVCache,
    seq_id: int,
    token_ids: Sequence[int],
    num_cached: int,
    end: int | None = None,
) -> torch.Tensor:
    """Run the model over an allocated sequence's tokens past its ``num_cached`` cached ones.

    ``token_ids`` is the list the sequence was allocated with. Returns the logits of its
    last token, (vocab,): they choose the first new token. ``end`` (chapter 8's chunked
    prefill): run only ``token_ids[num_cached:end]``, a chunk, over the K/V of the
    ``num_cached`` before it, which earlier chunks wrote; the logits are the chunk's last
    token's, of use only when the chunk ends the sequence.
    """
    if end is None or end == len(token_ids):
        cache.schedule([seq_id])
        end = len(token_ids)
    else:
        if not num_cached < end <= len(token_ids):
            raise KVLibError(
                f"a chunk [{num_cached}:{end}] outside sequence {seq_id} of {len(token_ids)} tokens"
            )
        cache.schedule([seq_id], partial=True)
    if end != len(token_ids) and cache.manager.num_computed(seq_id) != num_cached:
        raise KVLibError(
            f"sequence {seq_id}: a chunk starts at {num_cached}, but {cache.manager.num_computed(seq_id)} "
            "of its tokens have K/V"
        )
    device = cache.k.device
    uncached = torch.tensor([list(token_ids[num_cached:end])], device=device)  # (1, chunk tokens)
    return model(uncached, cache, last_only=True)[0, -1]  # (1, 1, vocab) -> (vocab,)


def give_slots(cache: PagedKVCache, seq_ids: Sequence[int], num_steps: int | None = None) -> None:
    """Give each sequence's newest token (already appended to its list) a slot; raise if short of blocks.

    ``num_steps``, the decode steps run so far, only makes the error say when the cache filled up.
    """
    manager = cache.manager
    for seq_id in seq_ids:
        if manager.append_slot(seq_id) is None:
            when = (
                f"{num_steps} decode steps"
                if num_steps is not None
                else f"{manager.num_tokens(seq_id)} tokens"
            )
            raise KVLibError(f"the cache of {manager.num_blocks} blocks is full after {when}")


@torch.inference_mode()
def decode_step(
    model: TinyLlama,
    cache: PagedKVCache,
    seq_ids: Sequence[int],
    token_ids: Sequence[Sequence[int]],
    append_slots: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step of a batch: each sequence's newest token in, the logits of the next out.

    ``token_ids[i]`` is the list of sequence ``seq_ids[i]``, its newest token (last) already
    appended by the caller. With ``append_slots`` each newest token first gets its slot
    (copy-on-write included); chapter 4's scheduler gives them slots itself, through its
    memory, and passes ``append_slots=False``. Returns (batch, vocab) logits: ``out`` if given.
    """
    if append_slots:
        give_slots(cache, seq_ids)
    cache.schedule(seq_ids)
    newest = cache.inputs.put("token_ids", [tokens[-1] for tokens in token_ids]).view(-1, 1)  # (batch, 1)
    if isinstance(model, LeanLlama):  # the fast path writes its logits into out
        logits = model(newest, cache, last_only=True, out=None if out is None else out[:, None])
    else:
        logits = model(newest, cache, last_only=True)
        logits = logits if out is None else out[:, None].copy_(logits)
    return logits[:, -1]  # (batch, 1, vocab) -> (batch, vocab)


def greedy_step(
    model: TinyLlama,
    cache: PagedKVCache,
    seq_ids: Sequence[int],
    token_ids: Sequence[Sequence[int]],
    append_slots: bool = True,
) -> list[int]:
    """The most likely next token of each sequence after :func:`decode_step`, whose logits and
    argmax go into buffers of the cache (:class:`~kvlib.paged.step_inputs.StepInputs`): with the
    lean model (:class:`~kvlib.model.lean.LeanLlama`), the step allocates no tensor (chapter 1's lean
    step, here on the paged cache)."""
    batch, vocab = len(seq_ids), model.config.vocab_size
    logits = cache.inputs.scratch("logits", (batch, vocab), model.lm_head.weight.dtype)
    decode_step(model, cache, seq_ids, token_ids, append_slots, out=logits)
    return torch.argmax(
        logits, dim=-1, out=cache.inputs.scratch("next_tokens", (batch,), torch.long)
    ).tolist()


def greedy(logits: torch.Tensor) -> list[int]:
    """The most likely token of each row of (batch, vocab) logits."""
    return logits.argmax(dim=-1).tolist()


@dataclass
class PagedGeneration:
    """Result of :func:`generate_paged`."""

    tokens: list[list[int]]  # per sequence: prompt followed by the generated tokens
    cache: PagedKVCache  # after generation
    allocations: list[Allocation]  # per prompt: how many of its tokens the prefix cache already held


@torch.inference_mode()
def generate_paged(
    model: TinyLlama,
    prompts: Sequence[Sequence[int]],
    num_new: int,
    block_size: int = 16,
    num_blocks: int | None = None,
) -> PagedGeneration:
    """Greedy generation for prompts of different lengths on one :class:`PagedKVCache`.

    Each prompt is prefilled alone (one forward pass over the tokens the prefix cache does
    not hold yet), then all sequences decode together, one token per step, in one batch.
    ``num_blocks`` defaults to what the sequences need without any sharing. The returned
    token lists are the ones the cache's manager reads (the last token has no slot).
    """
    if not isinstance(num_new, int) or num_new < 1:
        raise KVLibError(f"num_new must be a positive integer, not {num_new!r}")
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or not prompts:
        raise KVLibError(f"prompts must be a non-empty list of token id lists, not {prompts!r}"[:200])
    for prompt in prompts:
        check_token_ids(prompt, "each prompt", model.config.vocab_size)
    block_size = require_int(block_size, "block_size")
    if num_blocks is None:
        num_blocks = sum(num_blocks_for(len(p) + num_new, block_size) for p in prompts)
    cache = PagedKVCache.for_model(model, num_blocks, block_size)
    tokens = [list(p) for p in prompts]  # this loop owns every sequence's tokens
    allocations = []
    for seq_id, seq_tokens in enumerate(tokens):
        allocation = cache.manager.allocate(seq_id, seq_tokens)
        if allocation is None:
            raise KVLibError(
                f"the cache of {num_blocks} blocks cannot hold prompt {seq_id} ({len(seq_tokens)} tokens)"
            )
        allocations.append(allocation)
        seq_tokens.append(
            int(prefill(model, cache, seq_id, seq_tokens, allocation.num_cached_tokens).argmax())
        )
    seq_ids = list(range(len(prompts)))
    for step in range(num_new - 1):
        give_slots(cache, seq_ids, step)
        next_tokens = greedy_step(model, cache, seq_ids, tokens, append_slots=False)
        for seq_tokens, token in zip(tokens, next_tokens, strict=True):
            seq_tokens.append(token)
    return PagedGeneration(tokens, cache, allocations)


@dataclass
class BranchRun:
    """Result of :func:`decode_branches`."""

    tokens: list[list[int]]  # per branch: prompt, its first token, then greedy tokens
    cache: PagedKVCache
    snapshots: dict[str, BlockSnapshot]  # "prefill", "fork", "copy-on-write": the block tables at each stage


@torch.inference_mode()
def decode_branches(
    model: TinyLlama,
    prompt: Sequence[int],
    first_tokens: Sequence[int],
    num_new: int,
    block_size: int = 16,
    num_blocks: int | None = None,
) -> BranchRun:
    """Parallel sampling in miniature: prefill ``prompt`` once, fork it into one branch per
    entry of ``first_tokens``, and decode all branches together in one batch.

    Branch ``i`` continues with ``first_tokens[i]`` (as if sampled) and then greedily for
    ``num_new - 1`` more tokens. The branches share the prompt's blocks; the first token each
    appends into the shared, partly filled last block triggers copy-on-write.
    """
    check_token_ids(prompt, "prompt", model.config.vocab_size)
    check_token_ids(first_tokens, "first_tokens", model.config.vocab_size)
    num_new = require_int(num_new, "num_new")
    block_size = require_int(block_size, "block_size")
    if num_blocks is None:
        num_blocks = len(first_tokens) * num_blocks_for(len(prompt) + num_new, block_size)
    cache = PagedKVCache.for_model(model, num_blocks, block_size)
    manager = cache.manager
    tokens = [list(prompt)]  # this loop owns every branch's tokens
    manager.allocate(0, tokens[0])
    prefill(model, cache, 0, tokens[0], 0)  # only the K/V are needed
    snapshots = {"prefill": block_snapshot(manager)}
    branches = list(range(len(first_tokens)))
    tokens += [manager.fork(0, branch) for branch in branches[1:]]
    snapshots["fork"] = block_snapshot(manager)
    next_tokens = list(first_tokens)
    for step in range(num_new - 1):
        for seq_tokens, token in zip(tokens, next_tokens, strict=True):
            seq_tokens.append(token)
        give_slots(cache, branches, step)
        if step == 0:  # the slots of the first step, before the forward pass caches any full block
            snapshots["copy-on-write"] = block_snapshot(manager)
        next_tokens = greedy(decode_step(model, cache, branches, tokens, append_slots=False))
    for seq_tokens, token in zip(tokens, next_tokens, strict=True):
        seq_tokens.append(token)
    return BranchRun(tokens, cache, snapshots)


def check_token_ids(token_ids, name: str, vocab_size: int) -> None:
    """KVLibError unless ``token_ids`` is a non-empty list or tuple of ids in 0..vocab_size - 1 (an id
    outside the vocabulary would be an IndexError in the embedding, far from the call)."""
    if not are_token_ids(token_ids) or not token_ids or max(token_ids) >= vocab_size:
        raise KVLibError(
            f"{name} must be a non-empty list of token ids in 0..{vocab_size - 1}, not {token_ids!r}"[:200]
        )
