"""How much KV memory sharing saves: parallel sampling and beam search with copy-on-write,
and a system prompt shared through prefix caching (chapter 4).

Parallel sampling asks for ``n`` continuations of one prompt; beam search keeps ``width``
candidates and, at every step, continues the best ``width`` of all their one-token
extensions. Both fork sequences (:meth:`kvlib.paged.BlockManager.fork`): the children
share the parent's blocks, and the first write into a shared, partly filled block copies
it. We count the blocks in use at every step and compare them with what the same
sequences would take without sharing (each its own blocks), as the vLLM paper does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvlib import KVLibError
from kvlib.measure.timing import one_cpu_thread
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import BlockManager, num_blocks_for
from kvlib.paged.decode_loop import decode_step, prefill
from kvlib.paged.paged_cache import PagedKVCache


@dataclass(frozen=True)
class SharingCount:
    """Blocks in use at every step with sharing, and without (every sequence its own blocks)."""

    used_blocks: np.ndarray  # (steps,)
    unshared_blocks: np.ndarray  # (steps,)

    @property
    def saving(self) -> float:
        """Share of KV memory saved, averaged over the steps: 1 - sum(used) / sum(unshared)."""
        return 1.0 - float(self.used_blocks.sum() / self.unshared_blocks.sum())

    @staticmethod
    def total(counts: list[SharingCount]) -> SharingCount:
        """Several requests together: their steps one after another."""
        return SharingCount(
            np.concatenate([c.used_blocks for c in counts]),
            np.concatenate([c.unshared_blocks for c in counts]),
        )


def _count(manager: BlockManager, seq_ids) -> tuple[int, int]:
    """Blocks in use, and blocks the sequences would take without sharing (each its own)."""
    used = manager.num_blocks - manager.num_free_blocks
    return used, sum(manager.num_blocks_for(manager.num_tokens(s)) for s in seq_ids)


def parallel_sampling_blocks(prompt_len: int, output_len: int, n: int, block_size: int = 16) -> SharingCount:
    """Blocks of ``n`` samples of one prompt, at each of the ``output_len`` steps.

    The prompt is stored once and forked; every sample then appends its own tokens (the
    first append into the shared last prompt block copies it). Only lengths matter here,
    so the token ids are made up; the model runs in :func:`beam_search`.
    """
    if min(prompt_len, output_len, n, block_size) < 1:
        raise KVLibError("prompt_len, output_len, n and block_size must be positive")
    manager = BlockManager(
        n * num_blocks_for(prompt_len + output_len, block_size) + n, block_size, enable_prefix_caching=False
    )
    tokens = [list(range(prompt_len))]  # this loop owns every sample's tokens
    manager.allocate(0, tokens[0])
    manager.mark_computed(0)
    tokens += [manager.fork(0, child) for child in range(1, n)]
    seqs, used, unshared = list(range(n)), [], []
    for step in range(output_len):
        if step:  # the token chosen at the previous step gets its slot
            for seq in seqs:
                tokens[seq].append(1000 * seq + step)
                manager.append_slot(seq)
                manager.mark_computed(seq)
        for values, value in zip((used, unshared), _count(manager, seqs), strict=True):
            values.append(value)
    return SharingCount(np.array(used), np.array(unshared))


@dataclass
class BeamRun:
    """Result of :func:`beam_search`: the final beams (prompt + generated), best first, and block counts."""

    beams: list[list[int]]
    scores: list[float]  # summed log-probabilities of the generated tokens
    count: SharingCount
    num_copies: int  # copy-on-write block copies


def _top_candidates(
    scores: torch.Tensor, logits: torch.Tensor, width: int
) -> tuple[list[int], list[int], list[float]]:
    """Best ``width`` one-token extensions of the beams: (beam index, token, new score), best first."""
    candidates = scores[:, None] + torch.log_softmax(logits.double(), dim=-1)  # (beams, vocab)
    best, flat = candidates.flatten().topk(width)
    vocab = logits.shape[-1]
    return (flat // vocab).tolist(), (flat % vocab).tolist(), best.tolist()


@torch.inference_mode()
def beam_search(model: TinyLlama, prompt, width: int, num_new: int, block_size: int = 16) -> BeamRun:
    """Beam search of ``width`` beams for ``num_new`` tokens on a paged cache with copy-on-write.

    A beam chosen by several candidates is forked (they share its blocks); a beam no
    candidate continues is freed. Scores are summed log-probabilities in float64.
    """
    if width < 1 or num_new < 1:
        raise KVLibError(f"beam search needs width >= 1 and num_new >= 1, not {width}, {num_new}")
    device = model.lm_head.weight.device
    with one_cpu_thread(device):
        return _beam_search(model, list(prompt), width, num_new, block_size, device)


def _beam_search(
    model: TinyLlama, prompt: list[int], width: int, num_new: int, block_size: int, device
) -> BeamRun:
    num_blocks = width * (num_blocks_for(len(prompt) + num_new, block_size) + 1)
    cache = PagedKVCache.for_model(model, num_blocks, block_size, enable_prefix_caching=False)
    manager = cache.manager
    tokens = {0: prompt}  # seq_id -> its tokens: this loop owns every beam's list
    manager.allocate(0, tokens[0])
    logits = prefill(model, cache, 0, tokens[0], 0)[None]  # (1, vocab)
    beams, next_id = [0], 1
    scores = torch.zeros(1, dtype=torch.float64, device=device)
    used, unshared = [], []
    for step in range(num_new):
        parents, chosen, best = _top_candidates(scores, logits, width)
        new_beams = []
        for parent in parents:  # the first candidate of a beam continues it; the others fork it
            if beams[parent] in new_beams:
                tokens[next_id] = manager.fork(beams[parent], next_id)
                new_beams.append(next_id)
                next_id += 1
            else:
                new_beams.append(beams[parent])
        for seq in set(beams) - set(new_beams):
            manager.free(seq)
            del tokens[seq]
        beams, scores = new_beams, torch.tensor(best, dtype=torch.float64, device=device)
        if step == num_new - 1:
            break
        for seq, token in zip(beams, chosen, strict=True):
            tokens[seq].append(token)
        logits = decode_step(model, cache, beams, [tokens[seq] for seq in beams])  # (width, vocab)
        # the forward pass changed no block (no prefix cache): the counts of the step's slots
        for values, value in zip((used, unshared), _count(manager, beams), strict=True):
            values.append(value)
    final = [tokens[seq] + [token] for seq, token in zip(beams, chosen, strict=True)]
    return BeamRun(final, scores.tolist(), SharingCount(np.array(used), np.array(unshared)), cache.num_copies)


@torch.inference_mode()
def beam_search_reference(
    model: TinyLlama, prompt, width: int, num_new: int
) -> tuple[list[list[int]], list[float]]:
    """The same beam search without any cache: every step runs the model over each beam's whole sequence."""
    device = model.lm_head.weight.device
    beams = [list(prompt)]
    scores = torch.zeros(1, dtype=torch.float64, device=device)
    for _ in range(num_new):
        logits = torch.cat([model(torch.tensor([b], device=device), last_only=True)[:, -1] for b in beams])
        parents, tokens, best = _top_candidates(scores, logits, width)
        beams = [beams[p] + [t] for p, t in zip(parents, tokens, strict=True)]
        scores = torch.tensor(best, dtype=torch.float64, device=device)
    return beams, scores.tolist()
