"""Freeing out-of-window blocks changes no token: chapter 10's decode on the small model.

The model is chapter 1's :class:`~kvlib.model.llama.TinyLlama` (seeded weights) with layers 0 and 2
sliding over :data:`WINDOW` tokens and layers 1 and 3 global, as Gemma-2 alternates them. The same
prompts are decoded greedily on a :class:`~kvlib.paged.window_cache.WindowedPagedCache` three ways:
every block kept; out-of-window blocks freed, in a pool only as large as that run needs (so freed
blocks are taken again and overwritten); and a control whose allocator frees by a window half the
attention's, which frees blocks the attention still reads.
"""

from __future__ import annotations

import torch

from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.window_cache import generate_windowed

WINDOW = 16  # tokens each sliding layer sees
SMALL_BLOCK_SIZE = 4
PROMPT_LENGTHS = (40, 29, 35)
SMALL_NUM_NEW = 48  # tokens generated per prompt
LOOSE_POOL = 200  # blocks: more than any run here needs


def freeing_runs(seed: int = 0) -> dict:
    """The three runs' tokens and block counts, and whether each matches the run that keeps every block."""
    model = TinyLlama(ModelConfig(seed=seed))
    generator = torch.Generator().manual_seed(seed + 1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]
    windows = [WINDOW, None, WINDOW, None]
    kept = generate_windowed(
        model, prompts, SMALL_NUM_NEW, windows, SMALL_BLOCK_SIZE, LOOSE_POOL, free_out_of_window=False
    )
    loose = generate_windowed(model, prompts, SMALL_NUM_NEW, windows, SMALL_BLOCK_SIZE, LOOSE_POOL)
    tight = generate_windowed(model, prompts, SMALL_NUM_NEW, windows, SMALL_BLOCK_SIZE, loose.peak_blocks)
    half = [WINDOW // 2, None, WINDOW // 2, None]
    control = generate_windowed(
        model, prompts, SMALL_NUM_NEW, windows, SMALL_BLOCK_SIZE, loose.peak_blocks, True, half
    )
    differing = sum(
        a != b for x, y in zip(control.tokens, kept.tokens, strict=True) for a, b in zip(x, y, strict=True)
    )
    return {
        "kept_blocks": kept.peak_blocks,
        "freed_peak_blocks": tight.peak_blocks,
        "blocks_freed": tight.num_window_frees,
        "tokens_identical": tight.tokens == kept.tokens,
        "control_tokens_differing": differing,
        "num_generated": len(PROMPT_LENGTHS) * SMALL_NUM_NEW,
        "tokens": tight.tokens,
    }
