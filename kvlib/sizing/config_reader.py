"""A Hugging Face ``config.json`` read into a :class:`~kvlib.sizing.spec.ModelSpec` (chapter 2).

Model families spell the same facts differently, and the reader must find in each config
the five things that bend the size formula (see :mod:`kvlib.sizing.spec`):
:func:`spec_from_config` reads the layer, head and width keys (with older aliases such as
GPT-2's ``n_layer`` and ``n_head``; contradictory spellings are an error), an explicit
``head_dim`` (Gemma), ``multi_query`` (Falcon-7B), sliding windows (``sliding_window``,
``layer_types``, Gemma-2's alternation, Qwen2's ``use_sliding_window``), Jamba's
``attn_layer_period`` / ``attn_layer_offset``, MLA's ``kv_lora_rank`` /
``qk_rope_head_dim``, and Whisper's encoder/decoder keys. It is what ``python -m kvlib size
path/to/config.json`` and the catalog (:mod:`kvlib.sizing.catalog`) use.
:func:`spec_from_model_config` describes chapter 1's own :class:`kvlib.model.ModelConfig`.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvlib import KVLibError
from kvlib.sizing.spec import ModelSpec, require_int

# Alternative spellings of the same config key (Falcon's and GPT-2's older names).
_ALIASES = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "hidden_size": ("hidden_size", "n_embd"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx"),
}

# layer_types entries of layers that keep no KV cache (Mamba, linear attention, ... in hybrid models)
NON_ATTENTION_LAYER_TYPES = ("mamba", "linear_attention", "conv", "mlp", "moe", "recurrent")


def load_config(config: dict | str | Path) -> dict:
    """A config as a dict: the dict itself, or the JSON file at a path."""
    if isinstance(config, dict):
        return config
    path = Path(config)
    if not path.is_file():
        raise KVLibError(f"no config file at {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise KVLibError(f"{path.name} is not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise KVLibError(f"{path.name} must hold a JSON object, not {type(data).__name__}")
    return data


def _get(config: dict, key: str, default=None, required: bool = True):
    """config[key] under any of its spellings; contradictory spellings are an error."""
    found = {name: config[name] for name in _ALIASES.get(key, (key,)) if config.get(name) is not None}
    if len(set(map(json.dumps, found.values()))) > 1:
        raise KVLibError(f"config contradicts itself: {', '.join(f'{k}={v}' for k, v in found.items())}")
    if found:
        return next(iter(found.values()))
    if required and default is None:
        raise KVLibError(f"config has no {key!r}")
    return default


def _int(config: dict, key: str, low: int = 1, **kwargs):
    value = _get(config, key, **kwargs)
    if value is not None:
        require_int(value, f"config key {key!r}", low)
    return value


def spec_from_config(
    config: dict | str | Path, name: str | None = None, max_context: int | None = None
) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face-style ``config.json`` (a dict or a path).

    Reads the layer, head and width keys (with ``head_dim`` taking precedence over
    ``hidden_size / num_attention_heads``, as Gemma needs), ``multi_query`` (one KV head,
    as Falcon-7B), sliding windows (``sliding_window``, ``layer_types``, Gemma-2's
    alternation, Qwen2's ``use_sliding_window``), Jamba's ``attn_layer_period`` /
    ``attn_layer_offset``, MLA's ``kv_lora_rank`` / ``qk_rope_head_dim``, and the
    encoder/decoder keys of Whisper-style models.
    """
    config = load_config(config)
    name = name or config.get("_name_or_path") or config.get("model_type") or "model from config"
    if config.get("is_encoder_decoder") or "decoder_layers" in config:
        return _encoder_decoder_spec(config, name, max_context)
    num_layers = _int(config, "num_hidden_layers")
    num_heads = _int(config, "num_attention_heads")
    head_dim = _head_dim(config, num_heads)
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=_num_kv_heads(config, num_heads),
        head_dim=head_dim,
        attention_layers=_attention_layers(config, num_layers),
        sliding_windows=_sliding_windows(config, num_layers),
        kv_lora_rank=_int(config, "kv_lora_rank", required=False),
        qk_rope_head_dim=_int(config, "qk_rope_head_dim", required=False),
        max_context=max_context or _int(config, "max_position_embeddings", required=False),
    )


def _head_dim(config: dict, num_heads: int, hidden_key: str = "hidden_size") -> int:
    if config.get("head_dim") is not None:
        return _int(config, "head_dim")
    hidden = _int(config, hidden_key)
    if hidden % num_heads:
        raise KVLibError(
            f"config has no 'head_dim' and {hidden_key} ({hidden}) is not divisible by the {num_heads} heads"
        )
    return hidden // num_heads


def _num_kv_heads(config: dict, num_heads: int) -> int:
    """KV heads: num_key_value_heads (or Falcon's num_kv_heads); multi_query means one."""
    kv_heads = _int(config, "num_key_value_heads", required=False)
    if config.get("multi_query") and not config.get("new_decoder_architecture"):
        if kv_heads not in (None, 1):
            raise KVLibError(
                f"config contradicts itself: multi_query is true but num_key_value_heads is {kv_heads}"
            )
        return 1  # Falcon-7B: its num_kv_heads is ignored when multi_query is set, as transformers does
    if kv_heads is None:
        kv_heads = _int(config, "num_kv_heads", required=False)
    kv_heads = num_heads if kv_heads is None else kv_heads
    if num_heads % kv_heads:
        raise KVLibError(
            f"config's num_attention_heads ({num_heads}) is not a multiple of "
            f"its num_key_value_heads ({kv_heads})"
        )
    return kv_heads


def _layer_types(config: dict, num_layers: int) -> list[str] | None:
    types = config.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers:
        raise KVLibError(f"config's layer_types must list {num_layers} layer types (num_hidden_layers)")
    for layer_type in types:
        if layer_type not in (
            "full_attention",
            "sliding_attention",
            "chunked_attention",
            *NON_ATTENTION_LAYER_TYPES,
        ):
            raise KVLibError(f"config's layer_types has an unknown type {layer_type!r}")
    return types


def _attention_layers(config: dict, num_layers: int) -> tuple[int, ...] | None:
    types = _layer_types(config, num_layers)
    if types is not None:
        return tuple(i for i, t in enumerate(types) if t not in NON_ATTENTION_LAYER_TYPES)
    period = _int(config, "attn_layer_period", required=False)
    if period is None:
        return None
    offset = _int(config, "attn_layer_offset", low=0, required=False) or 0
    if offset >= period:
        raise KVLibError(
            f"config's attn_layer_offset ({offset}) must be smaller than attn_layer_period ({period})"
        )
    return tuple(i for i in range(num_layers) if i % period == offset)


def _sliding_windows(config: dict, num_layers: int) -> tuple[int | None, ...]:
    window = _int(config, "sliding_window", required=False)
    if config.get("use_sliding_window") is False:  # Qwen2: the window is configured but switched off
        window = None
    types = _layer_types(config, num_layers)
    if types is not None:
        chunk = _int(config, "attention_chunk_size", required=False)
        windows = {"sliding_attention": window, "chunked_attention": chunk}
        if any(t in windows and windows[t] is None for t in types):
            raise KVLibError(
                "config's layer_types has sliding/chunked layers but no sliding_window/attention_chunk_size"
            )
        return tuple(windows.get(t) for t in types)
    if window is None:
        return (None,) * num_layers
    if config.get("model_type") in ("gemma2",):  # alternating: even layers local, odd layers global
        return tuple(window if i % 2 == 0 else None for i in range(num_layers))
    if config.get("use_sliding_window"):  # Qwen2: layers from max_window_layers on use the window
        first = _int(config, "max_window_layers", low=0, required=False) or 0
        return tuple(window if i >= first else None for i in range(num_layers))
    return (window,) * num_layers  # Mistral: every layer


def _encoder_decoder_spec(config: dict, name: str, max_context: int | None) -> ModelSpec:
    """Whisper/BART-style keys: decoder layers cache self-attention and cross-attention K/V."""
    num_heads = _int(config, "decoder_attention_heads")
    return ModelSpec(
        name=name,
        num_layers=_int(config, "decoder_layers"),
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=_head_dim(config, num_heads, hidden_key="d_model"),
        cross_attention_tokens=_int(config, "max_source_positions"),
        num_encoder_layers=_int(config, "encoder_layers", low=0),
        max_context=max_context or _int(config, "max_target_positions"),
    )


def spec_from_model_config(config, name: str = "kvlib TinyLlama") -> ModelSpec:
    """The description of a :class:`kvlib.model.ModelConfig` (chapter 1's model)."""
    return ModelSpec(
        name,
        config.num_layers,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        max_context=config.max_seq_len,
    )
