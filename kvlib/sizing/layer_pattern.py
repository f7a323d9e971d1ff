"""Which layers of a ``config.json`` keep a KV cache, and how much of it (chapter 2).

Hugging Face configs spell the layer pattern in nine ways; :func:`layer_groups_from_config`
reads each into :class:`~kvlib.sizing.layer_groups.LayerGroups` the way transformers
reads it:

- ``layer_types`` (and ``layers_block_type``, transformers 5's Nemotron-H): one entry per
  layer (``full_attention``, ``attention`` (Granite-4), ``sliding_attention``,
  ``chunked_attention``, and the layers without a KV cache in
  :data:`NON_ATTENTION_LAYER_TYPES`);
- ``sliding_window_pattern`` (Gemma-3, default 6; Cohere2, default 4): layer i is global
  when ``(i + 1) % pattern == 0``, the others slide; Gemma-2 alternates (pattern 2);
- ``attn_layer_indices`` (Bamba): the attention layers, the others Mamba;
- ``hybrid_override_pattern`` (Nemotron-H): one letter per layer, ``*`` attention, ``M``
  Mamba, ``-`` MLP, ``E`` mixture of experts;
- ``attn_layer_period`` / ``attn_layer_offset`` (Jamba): layer i attends when
  ``i % period == offset``;
- ``full_attention_interval`` (Qwen3-Next): layer i is full attention when
  ``(i + 1) % interval == 0``, the others linear attention;
- ``no_rope_layers`` with ``attention_chunk_size`` (Llama-4): layers with RoPE attend in
  chunks (at most a chunk cached), every ``no_rope_layer_interval``-th (4) is global;
- ``use_sliding_window`` with ``max_window_layers`` (Qwen2): layers from
  ``max_window_layers`` on slide, the ones before are full (and no window at all when
  ``use_sliding_window`` is false, its default);
- ``cross_attention_layers`` (Llama-3.2-Vision): those layers cache the image tokens'
  K/V (a fixed number), not the text's.

When a config spells the pattern twice (recent Gemma-3 configs carry ``layer_types`` and
``sliding_window_pattern``), both readings must agree.
"""

from __future__ import annotations

from kvlib import KVLibError
from kvlib.sizing.layer_groups import (
    FULL_ATTENTION,
    MAX_LISTED_LAYERS,
    NO_CACHE,
    LayerGroups,
    LayerKind,
    LayerRun,
    require_count,
)

# layer_types entries of layers that keep no KV cache (Mamba, linear attention, ... in hybrid models)
NON_ATTENTION_LAYER_TYPES = ("mamba", "linear_attention", "conv", "mlp", "moe", "recurrent")
# layer_types entries of layers that cache every token
FULL_LAYER_TYPES = ("full_attention", "attention")

# transformers' defaults of sliding_window_pattern, for configs that leave it out
DEFAULT_PATTERN = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}
# model types whose sliding_window applies only when use_sliding_window is true (default false)
QWEN2_LIKE = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl", "qwen2_audio")
# Indices (attn_layer_indices, cross_attention_layers) kvlib reads of a stack longer than
# MAX_LISTED_LAYERS, where it keeps runs instead of listing the layers (published models: a few dozen).
MAX_SPARSE_INDICES = 10_000
# Letters of Nemotron-H's hybrid_override_pattern, and whether such a layer caches K/V
HYBRID_LETTERS = {"*": True, "M": False, "-": False, "E": False}


def _int(config: dict, key: str, low: int = 1, default=None):
    value = config.get(key)
    if value is None:
        return default
    return require_count(value, f"config key {key!r}", low)


def _listed(key: str, n: int) -> None:
    """Refuse a per-layer list (or a pattern period) longer than kvlib lists layer by layer."""
    if n > MAX_LISTED_LAYERS:
        raise KVLibError(
            f"config's {key} lists {n:,} layers; kvlib reads per-layer patterns of at most "
            f"{MAX_LISTED_LAYERS:,} layers"
        )


def _int_list(config: dict, key: str, low: int = 0) -> list[int]:
    values = config[key]
    if not isinstance(values, list):
        raise KVLibError(f"config's {key} must be a list of integers, not {type(values).__name__}")
    _listed(key, len(values))
    for value in values:
        require_count(value, f"an entry of config's {key}", low)
    return values


def _window(config: dict) -> int | None:
    """The sliding window, or None (Qwen2: only when use_sliding_window is true)."""
    window = _int(config, "sliding_window")
    if config.get("model_type") in QWEN2_LIKE and not config.get("use_sliding_window"):
        return None
    if config.get("use_sliding_window") is False:
        return None
    return window


def _need(value, what: str, key: str):
    if value is None:
        raise KVLibError(f"config's {key} has {what} layers but no {what} size")
    return value


def _from_layer_types(config: dict, num_layers: int, key: str = "layer_types") -> LayerGroups:
    types = config[key]
    if isinstance(types, list):
        _listed(key, len(types))
    if not isinstance(types, list) or len(types) != num_layers:
        raise KVLibError(f"config's {key} must list {num_layers:,} layer types (num_hidden_layers)")
    window, chunk = _window(config), _int(config, "attention_chunk_size")
    kinds = {t: FULL_ATTENTION for t in FULL_LAYER_TYPES} | {t: NO_CACHE for t in NON_ATTENTION_LAYER_TYPES}
    for layer_type in {t for t in types if isinstance(t, str)}:
        if layer_type == "sliding_attention":
            kinds[layer_type] = LayerKind(window=_need(window, "sliding_window", key))
        elif layer_type == "chunked_attention":
            kinds[layer_type] = LayerKind(window=_need(chunk, "attention_chunk_size", key))
    for layer_type in types:
        if not isinstance(layer_type, str) or layer_type not in kinds:
            raise KVLibError(f"config's {key} has an unknown type {layer_type!r}"[:200])
    return LayerGroups.from_kinds([kinds[t] for t in types])


def _from_global_every(num_layers: int, every: int, local: LayerKind, key: str) -> LayerGroups:
    """Layer i global (full attention) when (i + 1) % every == 0, else ``local``.

    A period longer than the stack has no global layer in it: all layers are ``local`` (no
    pattern of ``every`` entries is built); a shorter one is listed, up to MAX_LISTED_LAYERS.
    """
    if every > num_layers:
        return LayerGroups.uniform(local, num_layers)
    _listed(key, every)
    return LayerGroups.periodic([local] * (every - 1) + [FULL_ATTENTION], num_layers)


def _from_indices(config: dict, key: str, num_layers: int, chosen: LayerKind, rest: LayerKind) -> LayerGroups:
    indices = _int_list(config, key)
    if sorted(set(indices)) != indices or (indices and indices[-1] >= num_layers):
        raise KVLibError(f"config's {key} must be increasing layer indices below {num_layers:,}")
    if num_layers <= MAX_LISTED_LAYERS:  # list the layers: one pass, whatever the number of indices
        kinds = [rest] * num_layers
        for index in indices:
            kinds[index] = chosen
        return LayerGroups.from_kinds(kinds)
    if len(indices) > MAX_SPARSE_INDICES:
        raise KVLibError(
            f"config's {key} lists {len(indices):,} layers of a {num_layers:,}-layer stack; beyond "
            f"{MAX_LISTED_LAYERS:,} layers kvlib reads at most {MAX_SPARSE_INDICES:,} such indices"
        )
    previous, runs = 0, []  # a huge stack: one run per gap and per chosen layer
    for index in indices:
        if index > previous:
            runs.append(LayerRun((rest,), index - previous))
        runs.append(LayerRun((chosen,), 1))
        previous = index + 1
    if previous < num_layers:
        runs.append(LayerRun((rest,), num_layers - previous))
    return LayerGroups(tuple(runs)).canonical()


def _from_hybrid_pattern(config: dict, num_layers: int) -> LayerGroups:
    pattern = config["hybrid_override_pattern"]
    if isinstance(pattern, str):
        _listed("hybrid_override_pattern", len(pattern))
    if not isinstance(pattern, str) or len(pattern) != num_layers:
        raise KVLibError(f"config's hybrid_override_pattern must be a string of {num_layers:,} letters")
    unknown = sorted(set(pattern) - set(HYBRID_LETTERS))
    if unknown:
        raise KVLibError(f"config's hybrid_override_pattern has unknown letters {unknown}")
    window = _window(config)
    attention = FULL_ATTENTION if window is None else LayerKind(window=window)
    return LayerGroups.from_kinds([attention if HYBRID_LETTERS[c] else NO_CACHE for c in pattern])


def _from_period(config: dict, num_layers: int) -> LayerGroups:
    period = _int(config, "attn_layer_period")
    offset = _int(config, "attn_layer_offset", low=0, default=0)
    if offset >= period:
        raise KVLibError(
            f"config's attn_layer_offset ({offset}) must be smaller than attn_layer_period ({period})"
        )
    window = _window(config)
    attention = FULL_ATTENTION if window is None else LayerKind(window=window)
    listed = min(period, num_layers)  # a period beyond the stack: only its first num_layers layers exist
    _listed("attn_layer_period", listed)
    pattern = [attention if i == offset else NO_CACHE for i in range(listed)]
    return LayerGroups.periodic(pattern, num_layers)


def _from_no_rope(config: dict, num_layers: int) -> LayerGroups:
    """Llama-4: no_rope_layers[i] == 1 means RoPE, a chunked layer; 0 means a global NoPE layer."""
    chunk = _need(_int(config, "attention_chunk_size"), "chunked", "attention_chunk_size")
    flags = config.get("no_rope_layers")
    if flags:  # an explicit list (an empty one means transformers' default)
        flags = _int_list(config, "no_rope_layers")
        if len(flags) != num_layers or set(flags) - {0, 1}:
            raise KVLibError(f"config's no_rope_layers must list {num_layers:,} flags, each 0 or 1")
        return LayerGroups.from_kinds([LayerKind(window=chunk) if f else FULL_ATTENTION for f in flags])
    every = _int(config, "no_rope_layer_interval", default=4)
    return _from_global_every(num_layers, every, LayerKind(window=chunk), "no_rope_layer_interval")


def _from_qwen2(config: dict, num_layers: int) -> LayerGroups:
    window = _window(config)
    first = _int(config, "max_window_layers", low=0, default=28)  # transformers' Qwen2Config default
    first = min(first, num_layers)
    parts = [LayerGroups.uniform(FULL_ATTENTION, first)] if first else []
    if num_layers > first:
        parts.append(LayerGroups.uniform(LayerKind(window=window), num_layers - first))
    return LayerGroups.concat(*parts)


def layer_readings(config: dict, num_layers: int, image_tokens: int | None) -> dict[str, LayerGroups]:
    """Every reading of the layer pattern this config spells, by the key that spells it."""
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise KVLibError(f"config's model_type must be a string, not {type(model_type).__name__}")
    window = _window(config)  # checked here, whichever spelling uses it
    attention = FULL_ATTENTION if window is None else LayerKind(window=window)
    readings = {}
    if config.get("order_of_interleaved_layers") not in (None, "local_attn_first"):  # Cohere2
        raise KVLibError(
            f"config's order_of_interleaved_layers {config['order_of_interleaved_layers']!r} is not "
            "'local_attn_first', the only order transformers implements"
        )
    for key in ("layer_types", "layers_block_type"):  # layers_block_type: transformers 5's Nemotron-H
        if config.get(key) is not None:
            readings[key] = _from_layer_types(config, num_layers, key)
    pattern = _int(config, "sliding_window_pattern", default=DEFAULT_PATTERN.get(model_type))
    internal = _int(config, "_sliding_window_pattern")  # transformers' own copy in Gemma-3's to_dict()
    if internal is not None and config.get("sliding_window_pattern") not in (None, internal):
        raise KVLibError("config contradicts itself: sliding_window_pattern and _sliding_window_pattern")
    pattern = internal or pattern
    if pattern is not None and _window(config) is not None:
        readings["sliding_window_pattern"] = _from_global_every(
            num_layers, pattern, LayerKind(window=_window(config)), "sliding_window_pattern"
        )
    if config.get("attn_layer_indices") is not None:
        readings["attn_layer_indices"] = _from_indices(
            config, "attn_layer_indices", num_layers, attention, NO_CACHE
        )
    if config.get("hybrid_override_pattern") is not None:
        readings["hybrid_override_pattern"] = _from_hybrid_pattern(config, num_layers)
    if config.get("attn_layer_period") is not None:
        readings["attn_layer_period"] = _from_period(config, num_layers)
    interval = _int(config, "full_attention_interval")
    if interval is not None:
        readings["full_attention_interval"] = _from_global_every(
            num_layers, interval, NO_CACHE, "full_attention_interval"
        )
    if config.get("attention_chunk_size") is not None and "layer_types" not in readings:
        readings["no_rope_layers"] = _from_no_rope(config, num_layers)
    if config.get("use_sliding_window") and _window(config) is not None and model_type in QWEN2_LIKE:
        readings["max_window_layers"] = _from_qwen2(config, num_layers)
    if config.get("cross_attention_layers") is not None:
        tokens = _need(image_tokens, "cross-attention", "cross_attention_layers")
        readings["cross_attention_layers"] = _from_indices(
            config, "cross_attention_layers", num_layers, LayerKind(fixed_tokens=tokens), FULL_ATTENTION
        )
    return readings


def layer_groups_from_config(config: dict, num_layers: int, image_tokens: int | None = None) -> LayerGroups:
    """The layer stack a (text) config describes; two spellings that disagree are an error."""
    readings = layer_readings(config, num_layers, image_tokens)
    if not readings:
        window = _window(config)
        return LayerGroups.uniform(FULL_ATTENTION if window is None else LayerKind(window=window), num_layers)
    (first, groups), *others = readings.items()
    for key, other in others:
        if other != groups:
            raise KVLibError(f"config contradicts itself: its {first} and its {key} give different layers")
    return groups
