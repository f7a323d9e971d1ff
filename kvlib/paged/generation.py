"""Paged attention in PyTorch and a paged KV cache that ``kvlib.model`` runs on (chapter 3).

The K/V of every layer live in one preallocated pool per layer, shaped
``(num_blocks, block_size, num_kv_heads, head_dim)`` as in vLLM. A
:class:`~kvlib.paged.BlockManager` decides which block holds which token; this module
writes new K/V through the *slot mapping* and reads them back through the *block tables*.

:func:`paged_attention` is the kernel: it gathers each sequence's blocks in block-table
order (one copy of the K/V it reads, which vLLM's CUDA kernel avoids by reading the blocks
in place) and attends with each K/V head shared by its group of query heads, as
:func:`kvlib.attention.grouped_attention` does for the contiguous cache. Chapter 3 checks
that both give the same result and measures what the gather costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import Allocation
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.paged.usage import BlockSnapshot
from kvlib.units import ceil_div


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
    device=None,
) -> PagedGeneration:
    """Greedy generation for prompts of different lengths on one :class:`PagedKVCache`.

    Each prompt is prefilled alone (one forward pass over the tokens the prefix cache does
    not hold yet), then all sequences decode together, one token per step, in one batch.
    ``num_blocks`` defaults to what the sequences need without any sharing.
    """
    if not isinstance(num_new, int) or num_new < 1:
        raise KVLibError(f"num_new must be a positive integer, not {num_new!r}")
    device = model.lm_head.weight.device if device is None else device
    if num_blocks is None:
        num_blocks = sum(ceil_div(len(p) + num_new, block_size) for p in prompts)
    cache = PagedKVCache(
        model.config, num_blocks, block_size, device=device, dtype=model.lm_head.weight.dtype
    )
    next_tokens, allocations = [], []
    for seq_id, prompt in enumerate(prompts):
        allocation = cache.manager.allocate(seq_id, prompt)
        if allocation is None:
            raise KVLibError(
                f"the cache of {num_blocks} blocks cannot hold prompt {seq_id} ({len(prompt)} tokens)"
            )
        allocations.append(allocation)
        cache.schedule([seq_id])
        uncached = torch.tensor([list(prompt)[allocation.num_cached_tokens :]], device=device)  # (1, new)
        next_tokens.append(int(model(uncached, cache, last_only=True)[0, -1].argmax()))
    seq_ids = list(range(len(prompts)))
    for step in range(num_new - 1):
        for seq_id, token in zip(seq_ids, next_tokens):
            if cache.manager.append_slot(seq_id, token) is None:
                raise KVLibError(f"the cache of {num_blocks} blocks is full after {step} decode steps")
        cache.schedule(seq_ids)
        logits = model(torch.tensor(next_tokens, device=device)[:, None], cache)  # (batch, 1, vocab)
        next_tokens = logits[:, -1].argmax(dim=-1).tolist()
    tokens = [cache.manager.token_ids(s) + [t] for s, t in zip(seq_ids, next_tokens)]
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
    if not first_tokens or num_new < 1:
        raise KVLibError("decode_branches needs at least one branch and num_new >= 1")
    device = model.lm_head.weight.device
    if num_blocks is None:
        num_blocks = len(first_tokens) * ceil_div(len(prompt) + num_new, block_size)
    cache = PagedKVCache(
        model.config, num_blocks, block_size, device=device, dtype=model.lm_head.weight.dtype
    )
    cache.manager.allocate(0, prompt)
    cache.schedule([0])
    model(torch.tensor([list(prompt)], device=device), cache, last_only=True)  # only the K/V are needed
    snapshots = {"prefill": cache.manager.snapshot()}
    branches = list(range(len(first_tokens)))
    for branch in branches[1:]:
        cache.manager.fork(0, branch)
    snapshots["fork"] = cache.manager.snapshot()
    next_tokens = list(first_tokens)
    for step in range(num_new - 1):
        for branch, token in zip(branches, next_tokens):
            if cache.manager.append_slot(branch, token) is None:
                raise KVLibError(f"the cache of {num_blocks} blocks is full after {step} decode steps")
        if step == 0:
            snapshots["copy-on-write"] = cache.manager.snapshot()
        cache.schedule(branches)
        logits = model(torch.tensor(next_tokens, device=device)[:, None], cache)  # (branches, 1, vocab)
        next_tokens = logits[:, -1].argmax(dim=-1).tolist()
    tokens = [cache.manager.token_ids(b) + [t] for b, t in zip(branches, next_tokens)]
    return BranchRun(tokens, cache, snapshots)
