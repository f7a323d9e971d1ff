"""The bridge between our tiny model and Hugging Face ``transformers``' Llama (chapters 1 and 2).

:func:`random_hf_llama` builds a randomly initialised ``LlamaForCausalLM`` from a small
``LlamaConfig`` (nothing is downloaded); :func:`load_hf_weights` and :func:`from_hf` copy
its weights into a :class:`~kvlib.model.llama.TinyLlama`, and :func:`max_logit_difference`
shows that both compute the same logits, which is chapter 1's correctness check. :func:`to_hf`
goes the other way, for :mod:`kvlib.chapters.ch01_no_cache.transformers_race`, which times ``generate``
beside our generation.

``transformers`` is imported only inside these functions (it takes seconds to import),
and its logging is lowered to errors only while they run (:func:`quiet_transformers`, which
chapter 2's :mod:`kvlib.chapters.ch02_cache_size.size_check` also uses): its generation code logs advice at
warning level that would otherwise land on stderr. Every model here is built from a local
configuration (no ``from_pretrained``), so nothing reaches the Hub; importing this module changes
no environment variable.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.model.seeding import seeded_weights


@contextmanager
def quiet_transformers():
    """Silence transformers' own logging (its info/warning lines go to stderr) for the block."""
    from transformers.utils import logging

    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


HF_PREFIX = "model."  # LlamaForCausalLM keeps all but lm_head under .model

# Our ModelConfig field -> LlamaConfig field, for the fields both have.
CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "d_ff": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
}


def hf_config(config: ModelConfig):
    """The ``LlamaConfig`` of ``config``'s shape (no special tokens: generation never stops early)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        **{theirs: getattr(config, ours) for ours, theirs in CONFIG_FIELDS.items()},
        head_dim=config.head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def random_hf_llama(config: ModelConfig, seed: int = 0):
    """A ``LlamaForCausalLM`` of ``config``'s shape with transformers' own random initialisation."""
    from transformers import LlamaForCausalLM

    with quiet_transformers(), seeded_weights(seed):
        return LlamaForCausalLM(hf_config(config)).eval()


def model_config_of(hf_model) -> ModelConfig:
    """Our :class:`ModelConfig` for a ``LlamaForCausalLM``; features our model lacks are named errors."""
    c = hf_model.config
    unsupported = {
        "attention_bias": getattr(c, "attention_bias", False),
        "mlp_bias": getattr(c, "mlp_bias", False),
        "tie_word_embeddings": getattr(c, "tie_word_embeddings", False),
    }
    for name, value in unsupported.items():
        if value:
            raise KVLibError(f"the Hugging Face model sets {name}=True, which TinyLlama does not implement")
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise KVLibError(
            f"the Hugging Face model uses rope_type {rope['rope_type']!r}; "
            "TinyLlama has only the default RoPE"
        )
    if c.hidden_act != "silu":
        raise KVLibError(
            f"the Hugging Face model uses hidden_act {c.hidden_act!r}; TinyLlama's MLP is SwiGLU (silu)"
        )
    if c.head_dim * c.num_attention_heads != c.hidden_size:
        raise KVLibError(
            f"head_dim {c.head_dim} x {c.num_attention_heads} heads != hidden_size {c.hidden_size}; "
            "TinyLlama needs them equal"
        )
    fields = {ours: getattr(c, theirs) for ours, theirs in CONFIG_FIELDS.items()}
    return ModelConfig(**fields, rope_theta=float(rope.get("rope_theta", 10000.0)))


def load_hf_weights(model: TinyLlama, hf_model) -> TinyLlama:
    """Copy a ``LlamaForCausalLM``'s weights into ``model`` (same names, minus the ``model.`` prefix).

    Every tensor must find its place with the same shape, and every weight of ``model``
    must be filled; anything else is an error naming the first offending tensor.
    """
    theirs = {key.removeprefix(HF_PREFIX): value for key, value in hf_model.state_dict().items()}
    ours = model.state_dict()
    missing = sorted(set(ours) - set(theirs))
    unexpected = sorted(set(theirs) - set(ours))
    if missing:
        raise KVLibError(
            f"the Hugging Face weights lack {missing[0]!r} ({len(missing)} missing): is the config the same?"
        )
    if unexpected:
        raise KVLibError(
            f"the Hugging Face weights have {unexpected[0]!r}, "
            f"which TinyLlama does not ({len(unexpected)} extra)"
        )
    for key, value in theirs.items():
        if value.shape != ours[key].shape:
            raise KVLibError(
                f"{key}: Hugging Face shape {tuple(value.shape)} != TinyLlama shape {tuple(ours[key].shape)}"
            )
    model.load_state_dict(theirs)
    return model


def from_hf(hf_model) -> TinyLlama:
    """A new :class:`TinyLlama` with the configuration and weights of a ``LlamaForCausalLM``."""
    return load_hf_weights(TinyLlama(model_config_of(hf_model)), hf_model).eval()


def to_hf(model: TinyLlama):
    """A ``LlamaForCausalLM`` with ``model``'s configuration and weights, on ``model``'s device."""
    hf_model = random_hf_llama(model.config)
    state = {
        HF_PREFIX + key if key != "lm_head.weight" else key: value
        for key, value in model.state_dict().items()
    }
    hf_model.load_state_dict(state)
    return hf_model.to(model.lm_head.weight.device).eval()


@torch.inference_mode()
def max_logit_difference(model: TinyLlama, hf_model, tokens: torch.Tensor) -> float:
    """Largest |ours - theirs| over the logits of every position of ``tokens`` (batch, seq)."""
    with quiet_transformers():
        theirs = hf_model(tokens).logits
    return (model(tokens) - theirs).abs().max().item()
