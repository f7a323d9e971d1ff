"""Greedy generation on the contiguous caches, with or without a KV cache (chapters 1, 3 and 6).

For :class:`~kvlib.model.llama.TinyLlama`, three modes produce the same tokens by different
amounts of work:

- ``"none"``: no cache; every step runs the model over the whole sequence so far.
- ``"cache"``: a preallocated :class:`~kvlib.cache.contiguous.ContiguousKVCache`; the prompt
  is processed once (prefill), then each step feeds only the newest token (decode). The lean
  model (:class:`~kvlib.model.lean.LeanLlama`, which the benchmarks choose) gets the cache tuned
  the same way, :class:`~kvlib.cache.fast_contiguous.FastContiguousKVCache`, and writes each
  step's logits in place.
- ``"concat"``: like ``"cache"``, but the cache grows by concatenation
  (:class:`~kvlib.cache.contiguous.ConcatKVCache`).

:class:`Decoder` makes one step at a time, so that chapter 1 can time every step and
run several modes side by side (:mod:`kvlib.chapters.ch01_no_cache.nocache_race`); :func:`generate` runs one
mode to the end (chapter 3 compares its tokens with the paged cache's).
:func:`generate_encdec` decodes with the :class:`~kvlib.model.encdec.EncoderDecoder` and
records the bytes of its two caches after every step: the self-attention cache grows, the
cross-attention one does not (chapters 1 and 6).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import ConcatKVCache, ContiguousKVCache
from kvlib.cache.fast_contiguous import FastContiguousKVCache
from kvlib.checks import check_token_tensor, is_int
from kvlib.model.encdec import EncoderDecoder
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama


@dataclass
class EncDecGeneration:
    """Tokens of :func:`generate_encdec` and the bytes each cache held after every step."""

    tokens: torch.Tensor  # (batch, 1 + num_new): start token, then the generated ones
    self_cache_bytes: list[int]  # per step: bytes of the self-attention K/V tensors (0 without a cache)
    cross_cache_bytes: list[int]  # per step: bytes of the cross-attention K/V held (0 without a cache)
    cross_kv_projections: int  # how many times a layer projected the encoder output to K and V


@torch.inference_mode()
def generate_encdec(
    model: EncoderDecoder, source: torch.Tensor, num_new: int, use_cache: bool = True
) -> EncDecGeneration:
    """Greedy decoding from a start token (id 0) for the encoded ``source`` (batch, src_len).

    With ``use_cache`` the cross-attention K/V are computed once and the self-attention
    K/V grow in a :class:`~kvlib.cache.contiguous.ConcatKVCache` (whose tensors are exactly what is
    held); without it, every step recomputes both from scratch.
    """
    check_token_tensor(source, "source", model.config.vocab_size)
    if not isinstance(num_new, int) or num_new < 1 or num_new + 1 > model.config.max_seq_len:
        raise KVLibError(
            f"num_new must be an integer from 1 to max_seq_len - 1 ({model.config.max_seq_len - 1}), "
            f"not {num_new!r}"
        )
    memory = model.encode(source)
    tokens = torch.zeros(source.shape[0], 1, dtype=torch.long, device=source.device)  # (batch, 1)
    cache = ConcatKVCache(model.config, device=source.device) if use_cache else None
    cross = model.cross_kv(memory) if use_cache else None
    projections = model.config.num_layers if use_cache else 0
    self_bytes, cross_bytes = [], []
    for _ in range(num_new):
        if not use_cache:
            cross = model.cross_kv(memory)  # recomputed at every step
            projections += model.config.num_layers
        logits = model.decode(tokens if cache is None else tokens[:, -1:], cross, cache)  # (batch, vocab)
        tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)  # one token longer
        self_bytes.append(cache.num_bytes if use_cache else 0)
        cross_bytes.append(cross.num_bytes if use_cache else 0)
    return EncDecGeneration(tokens, self_bytes, cross_bytes, projections)


MODES = ("none", "cache", "concat")


@dataclass
class Generation:
    """What :func:`generate` returns: the tokens, the logits that chose each new one, and the cache."""

    tokens: torch.Tensor  # (batch, prompt_len + num_new): prompt followed by the generated tokens
    step_logits: list[torch.Tensor]  # num_new entries of (batch, vocab): logits that chose each new token
    cache: object = None  # the cache object after generation (None for mode "none")


class Decoder:
    """Greedy decoding of a batch of prompts in one mode, one new token per :meth:`step`.

    ``tokens`` (batch, prompt_len + steps done) holds the prompt and what was generated, in
    a buffer sized for ``num_new`` tokens, so a step allocates no token tensor; ``cache`` is
    the mode's cache (None for ``"none"``), sized the same: for ``"cache"`` the readable
    :class:`~kvlib.cache.contiguous.ContiguousKVCache`, or the fast one for a
    :class:`~kvlib.model.lean.LeanLlama`.
    """

    def __init__(self, model: TinyLlama, prompt: torch.Tensor, num_new: int, mode: str = "cache"):
        if mode not in MODES:
            raise KVLibError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[1] < 1:
            shape = tuple(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__
            raise KVLibError(f"prompt must be a (batch, prompt_len >= 1) tensor of token ids, not {shape}")
        check_token_tensor(prompt, "prompt", model.config.vocab_size)
        if not is_int(num_new) or num_new < 1:
            raise KVLibError(f"num_new must be a positive integer, not {num_new!r}")
        total = prompt.shape[1] + num_new
        if total > model.config.max_seq_len:
            raise KVLibError(
                f"prompt + num_new = {total} tokens exceeds max_seq_len ({model.config.max_seq_len})"
            )
        self.model, self.mode, self.num_new = model, mode, num_new
        self.lean = isinstance(model, LeanLlama)  # the fast path: writes its logits into a given tensor
        self.cache = None
        if mode == "cache":
            preallocated = FastContiguousKVCache if self.lean else ContiguousKVCache
            self.cache = preallocated(model.config, prompt.shape[0], total, device=prompt.device)
        elif mode == "concat":
            self.cache = ConcatKVCache(model.config, device=prompt.device)
        batch, prompt_len = prompt.shape
        # (batch, prompt_len + num_new): the prompt, then each generated token written into its slot
        self._tokens = torch.empty(batch, total, dtype=torch.long, device=prompt.device)
        self._tokens[:, :prompt_len] = prompt
        # (num_new, batch, vocab): the logits of each step, written in place by the model
        self._logits = torch.empty(num_new, batch, model.config.vocab_size, device=prompt.device)
        self._logits = self._logits.to(model.lm_head.weight.dtype)
        self._length = prompt_len  # tokens of each sequence so far
        self._next_input = prompt  # what the next forward pass reads when there is a cache
        self.steps_done = 0

    @property
    def tokens(self) -> torch.Tensor:
        """The prompt and the tokens generated so far, (batch, prompt_len + steps done): a view."""
        return self._tokens[:, : self._length]

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        """Generate one token for every sequence; return the logits that chose it, (batch, vocab)."""
        if self.steps_done == self.num_new:
            raise KVLibError(
                f"this decoder was sized for {self.num_new} new tokens and has generated them all"
            )
        model_input = self.tokens if self.cache is None else self._next_input
        logits = self._logits[self.steps_done]  # (batch, vocab), a view
        if self.lean:
            self.model(model_input, self.cache, last_only=True, out=logits.unsqueeze(1))  # (batch, 1, vocab)
        else:
            logits.copy_(self.model(model_input, self.cache, last_only=True)[:, -1])  # (batch, vocab)
        self._next_input = self._tokens[:, self._length : self._length + 1]  # (batch, 1): the next slot
        torch.argmax(logits, dim=-1, keepdim=True, out=self._next_input)  # written in place, no torch.cat
        self._length += 1
        self.steps_done += 1
        return logits


def generate(model: TinyLlama, prompt: torch.Tensor, num_new: int, mode: str = "cache") -> Generation:
    """Greedily append ``num_new`` tokens to ``prompt`` (batch, prompt_len)."""
    decoder = Decoder(model, prompt, num_new, mode)
    step_logits = [decoder.step() for _ in range(num_new)]
    return Generation(decoder.tokens, step_logits, decoder.cache)
