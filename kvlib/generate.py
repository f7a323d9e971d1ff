"""Greedy generation with ``kvlib.model``, with or without a KV cache (chapter 1).

Three modes produce the same tokens by different amounts of work:

- ``"none"``: no cache; every step runs the model over the whole sequence so far.
- ``"cache"``: a preallocated :class:`~kvlib.cache.ContiguousKVCache`; the prompt is
  processed once (prefill), then each step feeds only the newest token (decode).
- ``"concat"``: like ``"cache"``, but the cache grows by concatenation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.cache import ConcatKVCache, ContiguousKVCache
from kvlib.model import TinyLlama

MODES = ("none", "cache", "concat")


@dataclass
class Generation:
    tokens: torch.Tensor  # (batch, prompt_len + num_new): prompt followed by the generated tokens
    step_logits: list[torch.Tensor]  # num_new entries of (batch, vocab): logits that chose each new token
    cache: object = None  # the cache object after generation (None for mode "none")


@torch.inference_mode()
def generate(model: TinyLlama, prompt: torch.Tensor, num_new: int, mode: str = "cache") -> Generation:
    """Greedily append ``num_new`` tokens to ``prompt`` (batch, prompt_len)."""
    if mode not in MODES:
        raise KVLibError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise KVLibError(f"prompt must be a (batch, prompt_len >= 1) tensor of token ids, not shape {tuple(prompt.shape)}")
    if not isinstance(num_new, int) or num_new < 1:
        raise KVLibError(f"num_new must be a positive integer, not {num_new!r}")
    total = prompt.shape[1] + num_new
    if total > model.config.max_seq_len:
        raise KVLibError(f"prompt + num_new = {total} tokens exceeds max_seq_len ({model.config.max_seq_len})")
    device = prompt.device
    cache = None
    if mode == "cache":
        cache = ContiguousKVCache(model.config, prompt.shape[0], total, device=device)
    elif mode == "concat":
        cache = ConcatKVCache(model.config, device=device)
    tokens, step_logits = prompt, []
    next_input = prompt
    for _ in range(num_new):
        logits = model(tokens if cache is None else next_input, cache)[:, -1]  # (batch, vocab)
        next_token = logits.argmax(dim=-1, keepdim=True)  # (batch, 1)
        tokens = torch.cat([tokens, next_token], dim=1)
        step_logits.append(logits)
        next_input = next_token
    return Generation(tokens, step_logits, cache)
