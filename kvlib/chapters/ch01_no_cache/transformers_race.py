"""Our cached generation against Hugging Face ``transformers``' ``generate`` (chapter 1).

What users would run instead of our loop: :func:`~kvlib.model.hf.to_hf` puts our weights
into a ``LlamaForCausalLM``, :func:`time_hf_generate` times its greedy ``generate`` with and
without its own KV cache, and :func:`race_generators` times our cached generation
(:func:`kvlib.cache.generation.generate`) beside ``generate`` with and without its cache by
one protocol (interleaved rounds, fastest run of each), which is what chapter 1 compares;
``python -m kvlib bench`` reports the ratio (:func:`kvlib.chapters.ch01_no_cache.nocache_race.bench`).
``transformers`` is imported only inside these functions, with its logging lowered
(:func:`~kvlib.model.hf.quiet_transformers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.cache.generation import generate
from kvlib.measure.timing import Timing, time_interleaved, time_it
from kvlib.model.hf import quiet_transformers, to_hf
from kvlib.model.llama import TinyLlama


def _hf_generate(hf_model, prompt: torch.Tensor, num_new: int, use_cache: bool) -> torch.Tensor:
    """Greedy ``generate`` of exactly ``num_new`` tokens (no special tokens stop it early)."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=num_new,
        min_new_tokens=num_new,
        do_sample=False,
        use_cache=use_cache,
        eos_token_id=None,
        pad_token_id=0,
    )
    with torch.inference_mode():
        return hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)


@dataclass(frozen=True)
class HFGeneration:
    """Result of :func:`time_hf_generate`: the tokens and the time of one ``generate`` call."""

    tokens: torch.Tensor  # (batch, prompt_len + num_new)
    timing: Timing

    def tokens_per_s(self, num_new: int) -> float:
        """Generated tokens per second of the median call, ``num_new`` tokens per sequence."""
        return self.tokens.shape[0] * num_new / self.timing.median_s


def time_hf_generate(
    hf_model, prompt: torch.Tensor, num_new: int, use_cache: bool, repeats: int = 3
) -> HFGeneration:
    """Time greedy ``hf_model.generate`` of exactly ``num_new`` tokens, with or without its KV cache.

    A 2-token generation runs first, untimed; then ``repeats`` full generations are timed.
    """
    if not isinstance(num_new, int) or num_new < 1:
        raise KVLibError(f"num_new must be a positive integer, not {num_new!r}")
    result = {}

    def run(length=num_new):
        result["tokens"] = _hf_generate(hf_model, prompt, length, use_cache)

    with quiet_transformers():
        run(2)  # warm-up: a short generation sets up what generate builds on its first call
        timing = time_it(run, repeats=repeats, warmup=0, device=prompt.device)
    return HFGeneration(result["tokens"], timing)


# The generators :func:`race_generators` times, by name.
GENERATORS = ("kvlib cache", "transformers cache", "transformers no cache")


@dataclass(frozen=True)
class GeneratorRace:
    """Result of :func:`race_generators`: each generator's timing and tokens, by name (:data:`GENERATORS`)."""

    num_new: int
    batch: int
    timings: dict[str, Timing]
    tokens: dict[str, torch.Tensor]  # name -> (batch, prompt_len + num_new)

    def tokens_per_s(self, name: str) -> float:
        """Generated tokens per second of ``name``'s fastest run (the least disturbed)."""
        if name not in self.timings:
            raise KVLibError(f"no generator {name!r} in this race; it timed {', '.join(self.timings)}")
        return self.batch * self.num_new / self.timings[name].min_s


def race_generators(
    model: TinyLlama, prompt: torch.Tensor, num_new: int, repeats: int = 3, names=GENERATORS
) -> GeneratorRace:
    """Time greedy generation of ``num_new`` tokens by ``names`` (our cached loop, and
    transformers' ``generate`` on the same weights with and without its cache), by one protocol.

    Each generator first runs a 2-token generation, untimed (``generate`` sets things up on
    its first call); then :func:`~kvlib.measure.timing.time_interleaved` runs ``repeats`` rounds,
    in which every generator generates once, taking turns to go first.
    """
    if not isinstance(num_new, int) or num_new < 1:
        raise KVLibError(f"num_new must be a positive integer, not {num_new!r}")
    names = tuple(names)
    if not names or len(set(names)) != len(names) or not set(names) <= set(GENERATORS):
        raise KVLibError(f"names must be distinct names among {', '.join(GENERATORS)}, not {names!r}")
    hf_model = to_hf(model) if any(name.startswith("transformers") for name in names) else None
    runs = {
        "kvlib cache": lambda length: generate(model, prompt, length, "cache").tokens,
        "transformers cache": lambda length: _hf_generate(hf_model, prompt, length, use_cache=True),
        "transformers no cache": lambda length: _hf_generate(hf_model, prompt, length, use_cache=False),
    }
    tokens = {}
    with quiet_transformers():
        for name in names:
            runs[name](2)  # warm-up
        timings = time_interleaved(
            {name: (lambda name=name: tokens.__setitem__(name, runs[name](num_new))) for name in names},
            rounds=repeats,
            number=1,
            warmup=0,
            device=prompt.device,
        )
    return GeneratorRace(num_new, prompt.shape[0], timings, tokens)
