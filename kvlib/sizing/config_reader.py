"""A Hugging Face ``config.json`` read into a :class:`~kvlib.sizing.spec.ModelSpec` (chapter 2).

Model families spell the same facts differently, and the reader must find in each config
what bends the size formula (see :mod:`kvlib.sizing.spec`). :func:`spec_from_config` reads

- layers, heads and widths under every family's names (GPT-2/GPT-J ``n_layer``, ``n_head``,
  ``n_embd``; MPT/DBRX ``n_layers``, ``n_heads``, ``d_model``, ``attn_config.kv_n_heads``;
  ChatGLM ``num_layers``, ``multi_query_group_num``, ``kv_channels``; Falcon
  ``multi_query``, ``new_decoder_architecture``, ``num_kv_heads``; OpenELM's per-layer
  ``num_kv_heads`` lists; an explicit ``head_dim`` or ``attention_head_dim``); two
  spellings that disagree are an error;
- the layer pattern (:mod:`kvlib.sizing.layer_pattern`: windows, chunks, hybrids,
  cross-attention layers);
- MLA's ``kv_lora_rank`` / ``qk_rope_head_dim``;
- encoder-decoder models (Whisper, BART ``encoder_layers``/``decoder_layers``, T5
  ``num_layers``/``num_decoder_layers``/``d_kv``);
- nested multimodal configs (``text_config``: Gemma-3-4B, Qwen2-VL, Llama-3.2-Vision).

Every key that could change the size and that kvlib does not understand is refused
(:mod:`kvlib.sizing.config_keys`). It is what ``python -m kvlib size path/to/config.json``
and the catalog (:mod:`kvlib.sizing.catalog`) use. :func:`spec_from_model_config`
describes chapter 1's own :class:`kvlib.model.ModelConfig`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.sizing.config_keys import KNOWN_KEYS, check_keys
from kvlib.sizing.layer_groups import MAX_COUNT, MAX_LISTED_LAYERS, LayerGroups, LayerKind, require_count
from kvlib.sizing.layer_pattern import layer_groups_from_config, layer_readings
from kvlib.sizing.spec import ModelSpec

# Alternative spellings of the same config key (GPT-2's, MPT's, ChatGLM's, OpenELM's names).
_ALIASES = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_transformer_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "model_dim"),
    "head_dim": ("head_dim", "attention_head_dim", "kv_channels"),
    "max_position_embeddings": (
        "max_position_embeddings",
        "n_positions",
        "n_ctx",
        "max_seq_len",
        "seq_length",
        "max_context_length",
        "max_sequence_length",
    ),
}

# Model types that keep no KV cache at all (state-space and recurrent models).
NO_KV_MODEL_TYPES = ("mamba", "mamba2", "rwkv", "rwkv5", "rwkv6", "rwkv7", "xlstm")
# Encoder-decoder model types (their decoder caches self- and cross-attention K/V).
ENCODER_DECODER_TYPES = ("t5", "mt5", "umt5", "bart", "mbart", "whisper", "marian", "pegasus")
# transformers' defaults that published configs rely on by leaving the key out (gemma-3-4b-it's
# text_config names neither its heads nor its head_dim; Falcon's config.json has no maximum context)
MODEL_TYPE_DEFAULTS = {
    "gemma3_text": {
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "sliding_window": 4096,
    },
    "falcon": {"max_position_embeddings": 2048},
    "jamba": {"attn_layer_period": 8, "attn_layer_offset": 4},
}
MAX_CONFIG_BYTES = 64 * 2**20  # no published config.json comes near; a bigger file is not one


def path_kind(path: Path) -> str:
    """ "file", "directory", or why the path cannot be read ("no such file", "file name too long",
    "too many levels of symbolic links", ...): os.stat's answer without its exception."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        return (error.strerror or type(error).__name__).lower()
    except ValueError:  # an embedded NUL byte
        return "not a valid path"
    return "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "not a regular file"


def _shown(path: Path) -> str:
    """A path for a message: at most 120 characters."""
    text = str(path)
    return text if len(text) <= 120 else text[:60] + "..." + text[-57:]


def load_config(config: dict | str | Path) -> dict:
    """A config as a dict: the dict itself, or the JSON file at a path (a folder: its config.json)."""
    if isinstance(config, dict):
        return config
    if not isinstance(config, (str, Path)):
        raise KVLibError(f"a config must be a dict or a path to a config.json, not {type(config).__name__}")
    path = Path(config)
    if not str(config).strip():
        raise KVLibError("a config path must not be empty")
    if path_kind(path) == "directory":
        path = path / "config.json"
        if path_kind(path) != "file":
            raise KVLibError(f"{path.parent} is a directory with no config.json in it")
    kind = path_kind(path)
    if kind != "file":
        raise KVLibError(f"no config file at {_shown(path)} ({kind})")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise KVLibError(f"{path.name} is larger than {MAX_CONFIG_BYTES // 2**20} MiB: not a config.json")
        text = path.read_bytes().decode("utf-8")
    except OSError as error:
        raise KVLibError(f"cannot read {_shown(path)}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise KVLibError(f"{path.name} is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise KVLibError(f"{path.name} is nested too deeply to be a config.json") from None
    except ValueError as error:  # JSONDecodeError, and integers beyond Python's 4,300-digit limit
        raise KVLibError(f"{path.name} is not valid JSON ({str(error).splitlines()[0][:200]})") from None
    if not isinstance(data, dict):
        raise KVLibError(f"{path.name} must hold a JSON object, not {type(data).__name__}")
    return data


def _get(config: dict, key: str, required: bool = True, low: int = 1):
    """config[key] under any of its spellings, an integer >= ``low``; contradictory spellings are an error."""
    found = {name: config[name] for name in _ALIASES.get(key, (key,)) if config.get(name) is not None}
    for name, value in found.items():
        require_count(value, f"config key {name!r}", low)
    if len(set(found.values())) > 1:
        raise KVLibError(f"config contradicts itself: {', '.join(f'{k}={v}' for k, v in found.items())}")
    if found:
        return next(iter(found.values()))
    if required:
        raise KVLibError(f"config has no {key!r}")
    return None


def _flatten(config: dict) -> dict:
    """A multimodal config's text_config plus the top-level keys it lacks (keys in both must agree)."""
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, dict):
        raise KVLibError(f"config's text_config must be an object, not {type(text).__name__}")
    check_keys(text, "config's text_config")
    top = {k: v for k, v in config.items() if k not in ("text_config", "model_type", "_name_or_path")}
    for key, value in top.items():
        if key in KNOWN_KEYS and key in text and isinstance(value, (int, str)) and text[key] != value:
            raise KVLibError(f"config contradicts itself: {key}={value} but text_config's {key}={text[key]}")
    return {**top, **text, "model_type": text.get("model_type") or config.get("model_type")}


def _image_tokens(config: dict) -> int:
    """Llama-3.2-Vision's image tokens: max_num_tiles x ((image_size / patch_size)^2 + 1) (one image)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        raise KVLibError("config has cross_attention_layers but no vision_config to count the image tokens")
    size, patch, tiles = (_get(vision, key) for key in ("image_size", "patch_size", "max_num_tiles"))
    tokens = tiles * ((size // patch) ** 2 + 1)
    if tokens > MAX_COUNT:
        raise KVLibError(
            f"config's vision_config gives {tokens:,} image tokens (max_num_tiles x ((image_size / "
            f"patch_size)^2 + 1)), beyond the {MAX_COUNT:,} kvlib sizes"[:200]
        )
    return tokens


def _check_model_type(config: dict, where: str = "config") -> None:
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise KVLibError(f"{where}'s model_type must be a string, not {type(model_type).__name__}")


# The longest model name a config may give (_name_or_path): real ones are a few dozen characters.
MAX_NAME_CHARS = 200


def spec_from_config(
    config: dict | str | Path,
    name: str | None = None,
    max_context: int | None = None,
    encoder_tokens: int | None = None,
    image_tokens: int | None = None,
) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face-style ``config.json`` (a dict or a path).

    ``encoder_tokens``: encoder positions each decoder layer cross-attends to (default:
    Whisper's ``max_source_positions``, or the longest input of BART/T5). ``image_tokens``:
    tokens Llama-3.2-Vision's cross-attention layers cache (default: one image,
    ``max_num_tiles x ((image_size / patch_size)^2 + 1)`` = 4 x 1,601 for 560-pixel tiles of
    14-pixel patches).
    """
    raw = load_config(config)
    check_keys(raw)
    _check_model_type(raw)
    if isinstance(raw.get("text_config"), dict):
        _check_model_type(raw["text_config"], "config's text_config")
    asked_image_tokens = image_tokens is not None  # the reader's default below is not a request
    model_type = raw.get("model_type")
    if model_type in NO_KV_MODEL_TYPES:
        raise KVLibError(f"model_type {model_type!r} has no attention layer: it keeps a fixed-size state")
    if raw.get("cross_attention_layers") is not None or isinstance(raw.get("text_config"), dict):
        if image_tokens is None and "cross_attention_layers" in (raw.get("text_config") or raw):
            image_tokens = _image_tokens(raw)
    config = dict(_flatten(raw))  # a copy: the reader may note MPT's window in it
    for key, value in MODEL_TYPE_DEFAULTS.get(config.get("model_type"), {}).items():
        if config.get(key) is None and not any(config.get(a) is not None for a in _ALIASES.get(key, ())):
            config[key] = value
    name = name or raw.get("_name_or_path") or model_type or "model from config"
    if not isinstance(name, str):
        raise KVLibError(f"config's _name_or_path must be a string, not {type(name).__name__}")
    if name == raw.get("_name_or_path") and (len(name) > MAX_NAME_CHARS or not name.isprintable()):
        raise KVLibError(
            f"config's _name_or_path must be printable text of at most {MAX_NAME_CHARS} characters, "
            f"not {name[:60]!r}{'...' if len(name) > 60 else ''}"
        )
    for key, value in (("max_context", max_context), ("encoder_tokens", encoder_tokens)):
        if value is not None:
            require_count(value, key, low=1)
    if image_tokens is not None:
        require_count(image_tokens, "image_tokens", low=0)
    if config.get("pre_seq_len") is not None:
        raise KVLibError(
            "config's pre_seq_len (P-tuning prefix tokens in every layer's cache) is not supported"
        )
    is_encoder_decoder = bool(
        config.get("is_encoder_decoder") or "decoder_layers" in config or model_type in ENCODER_DECODER_TYPES
    )
    if asked_image_tokens and "cross_attention_layers" not in config:
        raise KVLibError(f"image_tokens apply to models with cross_attention_layers, not to {name}")
    if encoder_tokens is not None and not is_encoder_decoder:
        raise KVLibError(f"encoder_tokens apply to encoder-decoder models, not to {name}")
    if is_encoder_decoder:
        return _encoder_decoder_spec(config, name, max_context, encoder_tokens)
    return _decoder_spec(config, name, max_context, image_tokens)


def _decoder_spec(config: dict, name: str, max_context: int | None, image_tokens: int | None) -> ModelSpec:
    num_layers = _get(config, "num_hidden_layers", required=False)
    if num_layers is None:  # transformers 5's Nemotron-H lists its layers and leaves the count out
        listed = config.get("layers_block_type") or config.get("hybrid_override_pattern")
        num_layers = (
            len(listed) if isinstance(listed, (list, str)) and listed else _get(config, "num_hidden_layers")
        )
    if config.get("model_type") == "bamba" and config.get("attn_layer_indices") is None:
        raise KVLibError("a Bamba config without attn_layer_indices has no attention layer (all Mamba)")
    attn = _attn_config(config)
    if isinstance(config.get("num_kv_heads"), list) or isinstance(config.get("num_query_heads"), list):
        num_heads, num_kv_heads, groups = _per_layer_heads(config, num_layers, image_tokens)
    else:
        num_heads = _get(config, "num_attention_heads")
        num_kv_heads = _num_kv_heads(config, num_heads, attn)
        groups = layer_groups_from_config(config, num_layers, image_tokens)
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=_head_dim(config, num_heads),
        kv_lora_rank=_get(config, "kv_lora_rank", required=False),
        qk_rope_head_dim=_get(config, "qk_rope_head_dim", required=False),
        max_context=max_context or _get(config, "max_position_embeddings", required=False),
        layer_groups=groups,
    )


def _attn_config(config: dict) -> dict:
    """MPT's and DBRX's attn_config (checked like the top level); its window becomes sliding_window."""
    attn = config.get("attn_config")
    if attn is None:
        return {}
    if not isinstance(attn, dict):
        raise KVLibError(f"config's attn_config must be an object, not {type(attn).__name__}")
    check_keys(attn, "config's attn_config")
    window = attn.get("sliding_window_size")
    if window not in (None, -1):
        require_int(window, "attn_config's sliding_window_size", low=1)
        if config.get("sliding_window") not in (None, window):
            raise KVLibError(
                "config contradicts itself: sliding_window and attn_config's sliding_window_size"
            )
        config["sliding_window"] = window  # the flattened copy or the caller's dict: same value either way
    return attn


def _per_layer_heads(config: dict, num_layers: int, image_tokens) -> tuple[int, int, LayerGroups]:
    """OpenELM: num_query_heads and num_kv_heads list one count per layer."""
    lists = {}
    for key in ("num_query_heads", "num_kv_heads"):
        values = config.get(key)
        if isinstance(values, list) and len(values) > MAX_LISTED_LAYERS:
            raise KVLibError(
                f"config's {key} lists {len(values):,} layers; kvlib reads per-layer lists of at most "
                f"{MAX_LISTED_LAYERS:,} layers"
            )
        if not isinstance(values, list) or len(values) != num_layers:
            raise KVLibError(f"config's {key} must list {num_layers:,} head counts (one per layer)")
        for value in values:
            require_count(value, f"an entry of config's {key}", low=1)
        lists[key] = values
    if layer_readings(config, num_layers, image_tokens):
        raise KVLibError(
            "config lists per-layer head counts and a layer pattern; kvlib reads one or the other"
        )
    for q, kv in zip(lists["num_query_heads"], lists["num_kv_heads"], strict=True):
        if q % kv:
            raise KVLibError(f"config has a layer with {q} query heads and {kv} KV heads (not a multiple)")
    groups = LayerGroups.from_kinds([LayerKind(num_kv_heads=kv) for kv in lists["num_kv_heads"]])
    return max(lists["num_query_heads"]), max(lists["num_kv_heads"]), groups


def _head_dim(config: dict, num_heads: int, hidden_key: str = "hidden_size") -> int:
    explicit = _get(config, "head_dim", required=False)
    if explicit is not None:
        return explicit
    hidden = _get(config, hidden_key)
    if hidden % num_heads:
        raise KVLibError(
            f"config has no 'head_dim' and {hidden_key} ({hidden}) is not divisible by the {num_heads} heads"
        )
    return hidden // num_heads


def _num_kv_heads(config: dict, num_heads: int, attn: dict) -> int:
    """KV heads under each family's name; multi_query means one, as transformers reads it."""
    found = {}
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv"):
        if config.get(key) is not None:
            found[key] = _get(config, key)
    if attn.get("kv_n_heads") is not None:
        require_int(attn["kv_n_heads"], "attn_config's kv_n_heads", low=1)
        found["attn_config.kv_n_heads"] = attn["kv_n_heads"]
    if attn.get("attn_type") == "multiquery_attention":
        found["attn_config.attn_type"] = 1
    if config.get("multi_query_attention") and config.get("multi_query_group_num") is not None:
        found["multi_query_group_num"] = _get(config, "multi_query_group_num")  # ChatGLM
    if config.get("multi_query") and not config.get("new_decoder_architecture"):
        if found.get("num_key_value_heads", 1) != 1:
            raise KVLibError(
                f"config contradicts itself: multi_query is true but num_key_value_heads is "
                f"{found['num_key_value_heads']}"
            )
        return 1  # Falcon-7B, StarCoder: a num_kv_heads beside multi_query is ignored, as transformers does
    if len(set(found.values())) > 1:
        raise KVLibError(f"config contradicts itself: {', '.join(f'{k}={v}' for k, v in found.items())}")
    kv_heads = next(iter(found.values()), num_heads)
    if num_heads % kv_heads:
        raise KVLibError(
            f"config's num_attention_heads ({num_heads}) is not a multiple of "
            f"its num_key_value_heads ({kv_heads})"
        )
    return kv_heads


def _encoder_decoder_spec(
    config: dict, name: str, max_context: int | None, encoder_tokens: int | None
) -> ModelSpec:
    """Whisper/BART/T5 keys: decoder layers cache self-attention and cross-attention K/V."""
    if config.get("decoder_layers") is not None:  # Whisper, BART
        num_layers, num_encoder = _get(config, "decoder_layers"), _get(config, "encoder_layers", low=0)
        num_heads = _get(config, "decoder_attention_heads")
        head_dim = _head_dim(config, num_heads, hidden_key="d_model")
        longest_input = _get(config, "max_source_positions", required=False)
        longest_output = _get(config, "max_target_positions", required=False)
    else:  # T5: num_layers is the encoder's, num_decoder_layers the decoder's (default the same)
        num_encoder = _get(config, "num_layers")
        num_layers = _get(config, "num_decoder_layers", required=False) or num_encoder
        num_heads = _get(config, "num_heads")
        head_dim = _get(config, "d_kv", required=False) or _head_dim(config, num_heads, hidden_key="d_model")
        longest_input = longest_output = None
    longest = _get(config, "max_position_embeddings", required=False)
    longest_input, longest_output = longest_input or longest, longest_output or longest
    if encoder_tokens is None and longest_input is None:
        raise KVLibError("config gives no encoder length; pass encoder_tokens")
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=head_dim,
        cross_attention_tokens=encoder_tokens or longest_input,
        num_encoder_layers=num_encoder,
        max_context=max_context or longest_output,
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
