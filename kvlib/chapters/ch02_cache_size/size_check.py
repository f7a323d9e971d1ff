"""The size formula against caches that exist in memory (chapter 2).

Two kinds of real caches are measured by the bytes of their tensors' storage, not by any
size attribute they report: the contiguous caches of :mod:`kvlib.cache.contiguous` after
:func:`kvlib.cache.generation.generate` (preallocated and concatenated), and the
``DynamicCache`` that Hugging Face ``transformers`` fills during ``generate`` for a small
randomly initialised model (no download; :func:`small_llama_config`,
:func:`small_deepseek_config`). Each is compared with :func:`kvlib.sizing.spec.cache_bytes`
for the same shapes, the configuration read by :mod:`kvlib.sizing.config_reader`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib.measure.timing import torch_threads
from kvlib.model.hf import quiet_transformers
from kvlib.model.seeding import seeded_weights
from kvlib.sizing.config_reader import spec_from_config, spec_from_model_config
from kvlib.sizing.spec import cache_bytes


@dataclass(frozen=True)
class CacheCheck:
    """Measured storage bytes of a real cache beside the formula's prediction."""

    what: str
    kind: str
    tokens: int
    batch: int
    measured_bytes: int
    predicted_bytes: int

    @property
    def equal(self) -> bool:
        """Whether the formula predicted the measured bytes exactly."""
        return self.measured_bytes == self.predicted_bytes


def storage_bytes(tensors) -> int:
    """Bytes allocated for the storages behind ``tensors`` (each storage counted once)."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None
    }
    return sum(storages.values())


def _prompt(vocab_size: int, batch: int, prompt_len: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))


def kvlib_cache_checks(
    config, batch: int = 2, prompt_len: int = 5, num_new: int = 8, seed: int = 0
) -> list[CacheCheck]:
    """Generate with :class:`~kvlib.model.llama.TinyLlama` in both cache modes; measure the caches (float32).

    The preallocated cache reserves prompt_len + num_new tokens up front; the concatenating
    cache holds the tokens fed so far (the last generated token is never fed back).
    """
    from kvlib.cache.generation import generate
    from kvlib.model.llama import TinyLlama

    spec = spec_from_model_config(config)
    model = TinyLlama(config)
    prompt = _prompt(config.vocab_size, batch, prompt_len, seed)
    checks = []
    for mode in ("cache", "concat"):
        with torch_threads(1):  # tiny tensors: threads would only wait for each other
            cache = generate(model, prompt, num_new, mode).cache
        k, v = (cache.k, cache.v) if mode == "cache" else (cache.k + cache.v, [])
        tokens = cache.max_len if mode == "cache" else cache.length
        measured = storage_bytes(k if mode == "concat" else [k, v])
        checks.append(
            CacheCheck(
                f"kvlib {mode}",
                spec.attention_kind,
                tokens,
                batch,
                measured,
                cache_bytes(spec, tokens, batch, "fp32"),
            )
        )
    return checks


def transformers_cache_check(
    config, batch: int = 2, prompt_len: int = 5, num_new: int = 8, seed: int = 0
) -> CacheCheck:
    """Generate greedily with a random-weight transformers model built from ``config`` and
    measure the tensors of the ``DynamicCache`` it returns (float32, CPU)."""
    from transformers import AutoModelForCausalLM

    with quiet_transformers(), seeded_weights(seed), torch_threads(1):
        model = AutoModelForCausalLM.from_config(config).eval()
        prompt = _prompt(config.vocab_size, batch, prompt_len, seed)
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=num_new,
            min_new_tokens=num_new,
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
        )
    cache = out.cache  # transformers 5 (formerly past_key_values)
    measured = storage_bytes([t for layer in cache.layers for t in (layer.keys, layer.values)])
    tokens = cache.get_seq_length()
    spec = spec_from_config(config.to_dict(), name=type(config).__name__)
    return CacheCheck(
        f"transformers {type(model).__name__}",
        spec.attention_kind,
        tokens,
        batch,
        measured,
        cache_bytes(spec, tokens, batch, "fp32"),
    )


def small_llama_config(num_kv_heads: int = 2):
    """A tiny random Llama (GQA with the default 2 KV heads for 4 query heads)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=64,
    )


def small_deepseek_config():
    """A tiny random DeepSeek-V3 (MLA: latent of kv_lora_rank 32 + rotary key of 8 per token and layer)."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        max_position_embeddings=64,
    )
