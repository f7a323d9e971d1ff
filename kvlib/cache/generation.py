"""(from encdec.py) A small encoder-decoder with cross-attention, to see which cache grows (chapter 1).

In an encoder-decoder (the original Transformer {cite}`vaswani2017attention`, T5,
Whisper) every decoder layer has two attentions. Self-attention looks at the tokens
generated so far, so its cache gains one key and one value per layer at every step.
Cross-attention looks at the encoder's output, which is fixed once the input is
encoded, so its keys and values are computed once and never grow. This model reuses
:mod:`kvlib.model`'s blocks: the encoder is a stack of decoder blocks whose attention
sees every position (:class:`FullAttention`), and each decoder block adds a
:class:`CrossAttention` between self-attention and the MLP.

(from generate.py) Greedy generation with ``kvlib.model``, with or without a KV cache (chapter 1).

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
from kvlib.cache.contiguous import ConcatKVCache, ContiguousKVCache
from kvlib.model.encdec import EncoderDecoder
from kvlib.model.llama import TinyLlama


@dataclass
class EncDecGeneration:
    """Tokens of :func:`generate_encdec` and the bytes each cache held after every step."""

    tokens: torch.Tensor  # (batch, 1 + num_new): start token, then the generated ones
    self_cache_bytes: list[int]  # per step: bytes of the self-attention K/V tensors (0 without a cache)
    cross_cache_bytes: list[
        int
    ]  # per step: bytes of the cross-attention K/V tensors held (0 without a cache)
    cross_kv_projections: int  # how many times a layer projected the encoder output to K and V


@torch.inference_mode()
def generate_encdec(
    model: EncoderDecoder, source: torch.Tensor, num_new: int, use_cache: bool = True
) -> EncDecGeneration:
    """Greedy decoding from a start token (id 0) for the encoded ``source`` (batch, src_len).

    With ``use_cache`` the cross-attention K/V are computed once and the self-attention
    K/V grow in a :class:`~kvlib.cache.ConcatKVCache` (whose tensors are exactly what is
    held); without it, every step recomputes both from scratch.
    """
    if source.dim() != 2 or source.shape[1] < 1:
        raise KVLibError(
            f"source must be a (batch, src_len >= 1) tensor of token ids, not shape {tuple(source.shape)}"
        )
    if not isinstance(num_new, int) or num_new < 1 or num_new + 1 > model.config.max_seq_len:
        raise KVLibError(
            f"num_new must be an integer from 1 to max_seq_len - 1 ({model.config.max_seq_len - 1}), not {num_new!r}"
        )
    memory = model.encode(source)
    tokens = torch.zeros(source.shape[0], 1, dtype=torch.long, device=source.device)
    cache = ConcatKVCache(model.config, device=source.device) if use_cache else None
    cross = model.cross_kv(memory) if use_cache else None
    projections = model.config.num_layers if use_cache else 0
    self_bytes, cross_bytes = [], []
    for _ in range(num_new):
        if not use_cache:
            cross = model.cross_kv(memory)  # recomputed at every step
            projections += model.config.num_layers
        logits = model.decode(tokens if cache is None else tokens[:, -1:], cross, cache)
        tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)
        self_bytes.append(cache.num_bytes if use_cache else 0)
        cross_bytes.append(cross.num_bytes if use_cache else 0)
    return EncDecGeneration(tokens, self_bytes, cross_bytes, projections)


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
            raise KVLibError(
                f"prompt + num_new = {total} tokens exceeds max_seq_len ({model.config.max_seq_len})"
            )
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
            raise KVLibError(
                f"this decoder was sized for {self.num_new} new tokens and has generated them all"
            )
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
