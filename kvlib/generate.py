"""Greedy generation with ``kvlib.model``, with or without a KV cache (chapter 1).

Three modes produce the same tokens by different amounts of work:

- ``"none"``: no cache; every step runs the model over the whole sequence so far.
- ``"cache"``: a preallocated :class:`~kvlib.cache.ContiguousKVCache`; the prompt is
  processed once (prefill), then each step feeds only the newest token (decode).
- ``"concat"``: like ``"cache"``, but the cache grows by concatenation.

:class:`Decoder` makes one step at a time, so that chapter 1 can time every step and
run several modes side by side; :func:`generate` runs one mode to the end.
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


class Decoder:
    """Greedy decoding of a batch of prompts in one mode, one new token per :meth:`step`.

    ``tokens`` (batch, prompt_len + steps done) holds the prompt and what was generated;
    ``cache`` is the mode's cache (None for ``"none"``), sized for ``num_new`` tokens.
    """

    def __init__(self, model: TinyLlama, prompt: torch.Tensor, num_new: int, mode: str = "cache"):
        if mode not in MODES:
            raise KVLibError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[1] < 1:
            shape = tuple(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__
            raise KVLibError(f"prompt must be a (batch, prompt_len >= 1) tensor of token ids, not {shape}")
        if not isinstance(num_new, int) or isinstance(num_new, bool) or num_new < 1:
            raise KVLibError(f"num_new must be a positive integer, not {num_new!r}")
        total = prompt.shape[1] + num_new
        if total > model.config.max_seq_len:
            raise KVLibError(f"prompt + num_new = {total} tokens exceeds max_seq_len ({model.config.max_seq_len})")
        self.model, self.mode, self.num_new = model, mode, num_new
        self.cache = None
        if mode == "cache":
            self.cache = ContiguousKVCache(model.config, prompt.shape[0], total, device=prompt.device)
        elif mode == "concat":
            self.cache = ConcatKVCache(model.config, device=prompt.device)
        self.tokens = prompt
        self._next_input = prompt  # what the next forward pass reads when there is a cache
        self.steps_done = 0

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        """Generate one token for every sequence; return the logits that chose it, (batch, vocab)."""
        if self.steps_done == self.num_new:
            raise KVLibError(f"this decoder was sized for {self.num_new} new tokens and has generated them all")
        model_input = self.tokens if self.cache is None else self._next_input
        logits = self.model(model_input, self.cache, last_only=True)[:, -1]  # (batch, vocab)
        next_token = logits.argmax(dim=-1, keepdim=True)  # (batch, 1)
        self.tokens = torch.cat([self.tokens, next_token], dim=1)
        self._next_input = next_token
        self.steps_done += 1
        return logits


def generate(model: TinyLlama, prompt: torch.Tensor, num_new: int, mode: str = "cache") -> Generation:
    """Greedily append ``num_new`` tokens to ``prompt`` (batch, prompt_len)."""
    decoder = Decoder(model, prompt, num_new, mode)
    step_logits = [decoder.step() for _ in range(num_new)]
    return Generation(decoder.tokens, step_logits, decoder.cache)
