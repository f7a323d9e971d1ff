"""Exact KV-cache byte counts for real models (chapter 2).

The cache of one attention layer holds, for every cached token, one key and one value
vector per KV head, so the whole cache is

    bytes = 2 x num_attention_layers x num_kv_heads x head_dim x tokens x batch x bytes_per_value

(the formula of the source article of this book). Real models bend it in five ways,
all handled here from a single description, :class:`ModelSpec`:

- **GQA / MQA**: ``num_kv_heads`` below ``num_heads`` (MQA: one).
- **Sliding-window layers** (Mistral, Gemma-2): such a layer never caches more than its
  window, ``min(tokens, window)`` tokens.
- **Hybrid models** (Jamba): only some layers are attention layers; the others keep a
  fixed-size state and no KV cache.
- **MLA** (DeepSeek-V2/V3): each layer caches one latent vector of
  ``kv_lora_rank + qk_rope_head_dim`` values per token, shared by all heads, instead of
  K and V per head.
- **Encoder-decoder models** (Whisper): every decoder layer also caches the cross-attention
  K and V of all encoder positions, computed once per input and not growing with the output.

KV quantization is a :class:`KVDtype`: fp8 stores one byte per value (with one scale per
tensor, which we neglect); int8 and int4 store 8 or 4 bits per value plus, for every
group of ``group_size`` consecutive values of a vector (default 32), one fp16 scale and
one fp16 zero point (asymmetric min-max quantization, as in KIVI-style KV quantizers).

:func:`spec_from_config` builds a description from a Hugging Face ``config.json``;
``kvlib/catalog/*.json`` ships real models (each file quotes its config and its source).
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from kvlib import KVLibError

GiB = 1024**3

# --------------------------------------------------------------------------- dtypes


@dataclass(frozen=True)
class KVDtype:
    """How cached values are stored: ``bits`` per value, plus per-group metadata for integer formats."""

    name: str
    bits: int
    group_size: int | None = None  # values sharing one scale (and zero point); None: no per-group metadata
    meta_bytes: int = 0  # bytes of metadata per group: fp16 scale + fp16 zero point = 4

    def vector_bytes(self, length: int) -> int:
        """Bytes of one stored vector of ``length`` values (a key, a value, or an MLA latent)."""
        data = -(-length * self.bits // 8)  # ceil: a 4-bit vector of odd length still fills its last byte
        groups = -(-length // self.group_size) if self.group_size else 0
        return data + groups * self.meta_bytes

    def describe(self) -> str:
        if not self.group_size:
            return f"{self.name}: {self.bits} bits per value"
        return (
            f"{self.name}: {self.bits} bits per value + one fp16 scale and one fp16 zero point "
            f"per {self.group_size} values"
        )


KV_DTYPES: dict[str, KVDtype] = {
    "fp32": KVDtype("fp32", 32),
    "fp16": KVDtype("fp16", 16),
    "bf16": KVDtype("bf16", 16),
    "fp8": KVDtype("fp8", 8),
    "int8": KVDtype("int8", 8, group_size=32, meta_bytes=4),
    "int4": KVDtype("int4", 4, group_size=32, meta_bytes=4),
}


def kv_dtype(dtype: str | KVDtype) -> KVDtype:
    """A :class:`KVDtype` from its name (``"fp16"``, ``"int4"`` ...) or itself."""
    if isinstance(dtype, KVDtype):
        return dtype
    if dtype not in KV_DTYPES:
        raise KVLibError(f"unknown KV dtype {dtype!r}; choose from {', '.join(KV_DTYPES)}")
    return KV_DTYPES[dtype]


# --------------------------------------------------------------------------- model description


@dataclass(frozen=True)
class ModelSpec:
    """What the KV cache of a model depends on (its weights do not matter here).

    ``num_layers`` counts the layers that run once per generated token (the decoder's, for
    an encoder-decoder model). ``attention_layers`` lists which of them keep a KV cache
    (default: all). ``sliding_windows`` gives, per layer, the window that caps its cache or
    ``None`` (default: no windows). MLA models set ``kv_lora_rank`` and ``qk_rope_head_dim``.
    Encoder-decoder models set ``cross_attention_tokens`` (encoder positions every decoder
    layer caches) and ``num_encoder_layers`` (which cache nothing).
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_layers: tuple[int, ...] | None = None
    sliding_windows: tuple[int | None, ...] | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    cross_attention_tokens: int = 0
    num_encoder_layers: int = 0
    max_context: int | None = None

    def __post_init__(self):
        for key in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
            _check_int(getattr(self, key), key, low=1)
        for key in ("cross_attention_tokens", "num_encoder_layers"):
            _check_int(getattr(self, key), key, low=0)
        if self.max_context is not None:
            _check_int(self.max_context, "max_context", low=1)
        if self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads:
            raise KVLibError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        layers = tuple(range(self.num_layers)) if self.attention_layers is None else tuple(self.attention_layers)
        if not layers or sorted(set(layers)) != list(layers) or layers[0] < 0 or layers[-1] >= self.num_layers:
            raise KVLibError(f"attention_layers must be increasing indices in 0..{self.num_layers - 1}, not {layers}")
        object.__setattr__(self, "attention_layers", layers)
        windows = (None,) * self.num_layers if self.sliding_windows is None else tuple(self.sliding_windows)
        if len(windows) != self.num_layers:
            raise KVLibError(f"sliding_windows has {len(windows)} entries for {self.num_layers} layers")
        for window in windows:
            if window is not None:
                _check_int(window, "sliding_window", low=1)
        object.__setattr__(self, "sliding_windows", windows)
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise KVLibError("MLA needs both kv_lora_rank and qk_rope_head_dim")
        if self.is_mla:
            _check_int(self.kv_lora_rank, "kv_lora_rank", low=1)
            _check_int(self.qk_rope_head_dim, "qk_rope_head_dim", low=1)

    @property
    def num_attention_layers(self) -> int:
        return len(self.attention_layers)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def attention_kind(self) -> str:
        """MHA, GQA, MQA or MLA: what the cache of one attention layer looks like."""
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def cached_vectors(self) -> tuple[int, int]:
        """(vectors, values per vector) one token adds to one attention layer's cache.

        K and V per KV head: (2 x num_kv_heads, head_dim). MLA: one latent of
        kv_lora_rank + qk_rope_head_dim values, (1, kv_lora_rank + qk_rope_head_dim).
        """
        if self.is_mla:
            return 1, self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads, self.head_dim

    def with_kv_heads(self, num_kv_heads: int, name: str | None = None) -> ModelSpec:
        """The same model with another number of KV heads (MHA/GQA/MQA variants of chapter 2)."""
        return ModelSpec(**{**asdict(self), "num_kv_heads": num_kv_heads, "name": name or self.name})


def _check_int(value, key: str, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise KVLibError(f"{key} must be an integer >= {low}, not {value!r}")


# --------------------------------------------------------------------------- byte counts


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, batch: int = 1, dtype_bytes: int = 2) -> int:
    """The plain formula 2 x L x H_kv x D_head x S x B x bytes (no windows, no hybrids, no MLA)."""
    for key, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                       ("seq_len", seq_len), ("batch", batch), ("dtype_bytes", dtype_bytes)):
        _check_int(value, key, low=1)
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch * dtype_bytes


def token_layer_bytes(spec: ModelSpec, dtype: str | KVDtype = "fp16") -> int:
    """Bytes one token occupies in one attention layer's cache."""
    vectors, length = spec.cached_vectors
    return vectors * kv_dtype(dtype).vector_bytes(length)


def bytes_per_token(spec: ModelSpec, dtype: str | KVDtype = "fp16") -> int:
    """Bytes one more token adds to the self-attention cache while it is shorter than every window."""
    return spec.num_attention_layers * token_layer_bytes(spec, dtype)


def cached_tokens(spec: ModelSpec, layer: int, context: int) -> int:
    """How many of ``context`` tokens layer ``layer`` keeps: all, or at most its sliding window."""
    window = spec.sliding_windows[layer]
    return context if window is None else min(context, window)


def check_context(spec: ModelSpec, context: int) -> None:
    """A context must be a positive integer no longer than the model's maximum (when known)."""
    _check_int(context, "context", low=1)
    if spec.max_context is not None and context > spec.max_context:
        raise KVLibError(f"context {context:,} exceeds {spec.name}'s maximum of {spec.max_context:,} tokens")


@dataclass(frozen=True)
class CacheSize:
    """Bytes of the KV cache of ``batch`` sequences of ``context`` tokens, split by kind."""

    model: str
    context: int
    batch: int
    kv_dtype: str
    bytes_per_token: int  # before any window cap
    self_attention_bytes: int
    cross_attention_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.self_attention_bytes + self.cross_attention_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GiB


def cache_size(spec: ModelSpec, context: int, batch: int = 1, dtype: str | KVDtype = "fp16") -> CacheSize:
    """The KV cache of ``batch`` sequences that have ``context`` tokens each (prompt + generated)."""
    check_context(spec, context)
    _check_int(batch, "batch", low=1)
    dtype = kv_dtype(dtype)
    per_layer = token_layer_bytes(spec, dtype)
    self_tokens = sum(cached_tokens(spec, layer, context) for layer in spec.attention_layers)
    cross_tokens = spec.cross_attention_tokens * spec.num_attention_layers
    return CacheSize(
        model=spec.name,
        context=context,
        batch=batch,
        kv_dtype=dtype.name,
        bytes_per_token=bytes_per_token(spec, dtype),
        self_attention_bytes=batch * self_tokens * per_layer,
        cross_attention_bytes=batch * cross_tokens * per_layer,
    )


def cache_bytes(spec: ModelSpec, context: int, batch: int = 1, dtype: str | KVDtype = "fp16") -> int:
    """Total bytes of :func:`cache_size` (self-attention plus cross-attention)."""
    return cache_size(spec, context, batch, dtype).total_bytes


def article_table(context: int = 262_144, kv_heads=(32, 8, 4, 1)) -> list[dict]:
    """The source article's table: 32 layers, hidden 4096, 32 heads (head_dim 128), fp16, batch 1."""
    base = ModelSpec("article model", num_layers=32, num_heads=32, num_kv_heads=32, head_dim=4096 // 32)
    rows = []
    for heads in kv_heads:
        spec = base.with_kv_heads(heads)
        size = cache_bytes(spec, context)
        rows.append({"scheme": spec.attention_kind + (f"-{heads}" if spec.attention_kind == "GQA" else ""),
                     "num_kv_heads": heads, "bytes": size, "GB (1024^3 B)": round(size / GiB, 1)})
    return rows


# --------------------------------------------------------------------------- config.json

# Alternative spellings of the same config key (Falcon's and GPT-2's older names).
_ALIASES = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "hidden_size": ("hidden_size", "n_embd"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx"),
}
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
        _check_int(value, f"config key {key!r}", low)
    return value


def spec_from_config(config: dict | str | Path, name: str | None = None, max_context: int | None = None) -> ModelSpec:
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
        raise KVLibError(f"config has no 'head_dim' and {hidden_key} ({hidden}) is not divisible by the {num_heads} heads")
    return hidden // num_heads


def _num_kv_heads(config: dict, num_heads: int) -> int:
    """KV heads: num_key_value_heads (or Falcon's num_kv_heads); multi_query means one."""
    kv_heads = _int(config, "num_key_value_heads", required=False)
    if config.get("multi_query") and not config.get("new_decoder_architecture"):
        if kv_heads not in (None, 1):
            raise KVLibError(f"config contradicts itself: multi_query is true but num_key_value_heads is {kv_heads}")
        return 1  # Falcon-7B: its num_kv_heads is ignored when multi_query is set, as transformers does
    if kv_heads is None:
        kv_heads = _int(config, "num_kv_heads", required=False)
    kv_heads = num_heads if kv_heads is None else kv_heads
    if num_heads % kv_heads:
        raise KVLibError(f"config's num_attention_heads ({num_heads}) is not a multiple of its num_key_value_heads ({kv_heads})")
    return kv_heads


def _layer_types(config: dict, num_layers: int) -> list[str] | None:
    types = config.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers:
        raise KVLibError(f"config's layer_types must list {num_layers} layer types (num_hidden_layers)")
    for layer_type in types:
        if layer_type not in ("full_attention", "sliding_attention", "chunked_attention", *NON_ATTENTION_LAYER_TYPES):
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
        raise KVLibError(f"config's attn_layer_offset ({offset}) must be smaller than attn_layer_period ({period})")
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
            raise KVLibError("config's layer_types has sliding/chunked layers but no sliding_window/attention_chunk_size")
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
    return ModelSpec(name, config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim,
                     max_context=config.max_seq_len)


# --------------------------------------------------------------------------- catalog


@dataclass(frozen=True)
class CatalogEntry:
    """One model of ``kvlib/catalog``: its description and where the numbers come from."""

    name: str
    hf_id: str
    source: str
    notes: str
    num_parameters: int
    parameters_source: str
    spec: ModelSpec = field(repr=False)
    config: dict = field(repr=False, compare=False)  # the config.json fields the file quotes


def catalog_names() -> list[str]:
    """Names of the shipped models, in catalog order."""
    return [entry.name for entry in _catalog()]


@lru_cache(maxsize=1)
def _catalog() -> tuple[CatalogEntry, ...]:
    entries = []
    for item in sorted(resources.files("kvlib").joinpath("catalog").iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            data = json.loads(item.read_text(encoding="utf-8"))
            spec = spec_from_config(data["config"], name=data["name"], max_context=data.get("max_context"))
            entries.append(CatalogEntry(data["name"], data["hf_id"], data["source"], data.get("notes", ""),
                                        data["num_parameters"], data["parameters_source"], spec, data["config"]))
    return tuple(sorted(entries, key=lambda e: _catalog_position(e.name)))


# Display order of the catalog (the order chapter 2 discusses the models); other files sort last.
CATALOG_ORDER = ("Llama-2-7B", "Llama-2-70B", "Llama-3-8B", "Llama-3-70B", "Mistral-7B-v0.1", "Mixtral-8x7B",
                 "Falcon-7B", "Qwen2.5-7B", "Gemma-2-9B", "DeepSeek-V3", "Jamba-v0.1", "Whisper-large-v3", "OPT-13B")


def _catalog_position(name: str) -> int:
    return CATALOG_ORDER.index(name) if name in CATALOG_ORDER else len(CATALOG_ORDER)


def catalog_entry(name: str) -> CatalogEntry:
    """A catalog model by name (case-insensitive); unknown names get the closest matches."""
    by_name = {entry.name.lower(): entry for entry in _catalog()}
    if name.lower() in by_name:
        return by_name[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(by_name), n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(by_name[c].name for c in close)}?" if close else f"; choose from {', '.join(catalog_names())}"
    raise KVLibError(f"unknown model {name!r}{hint}")


def catalog_config(name: str) -> dict:
    """A copy of the ``config.json`` fields a catalog file quotes, for keys ModelSpec does not
    keep (Mamba's, in chapter 5) and for exercises that feed a raw config to the reader's code."""
    return dict(catalog_entry(name).config)


def resolve_model(model: str | Path) -> ModelSpec:
    """A catalog name, or a path to a ``config.json`` (anything with a path separator or a .json suffix)."""
    text = str(model)
    if text.endswith(".json") or "/" in text or "\\" in text or Path(text).is_file():
        return spec_from_config(text, name=Path(text).name)
    return catalog_entry(text).spec


def catalog_table(dtype: str | KVDtype = "fp16") -> list[dict]:
    """One row per catalog model: its cache at its maximum context, batch 1."""
    rows = []
    for entry in _catalog():
        spec = entry.spec
        size = cache_size(spec, spec.max_context, 1, dtype)
        rows.append({
            "model": entry.name, "kind": spec.attention_kind,
            "attention layers": f"{spec.num_attention_layers}/{spec.num_layers}",
            "kv heads": spec.num_kv_heads if not spec.is_mla else "latent",
            "head_dim": spec.head_dim if not spec.is_mla else spec.cached_vectors[1],
            "bytes/token": size.bytes_per_token, "max context": spec.max_context,
            "cache at max context (GiB)": round(size.total_gib, 3),
        })
    return rows


def plot_catalog(dtype: str | KVDtype = "fp16"):
    """Cache of one sequence at each catalog model's maximum context (log scale), coloured by kind."""
    from matplotlib.patches import Patch

    from kvlib.plotting import axes

    rows = catalog_table(dtype)[::-1]
    fig, ax = axes(f"KV cache of one sequence at the model's maximum context ({kv_dtype(dtype).name})",
                   "GiB (log scale)", "", logx=True, size=(7.5, 4.6))
    colours = {"MHA": "tab:red", "GQA": "tab:blue", "MQA": "tab:green", "MLA": "tab:purple"}
    ax.barh([r["model"] for r in rows], [r["cache at max context (GiB)"] for r in rows],
            color=[colours[r["kind"]] for r in rows])
    for i, r in enumerate(rows):
        ax.annotate(f" {r['cache at max context (GiB)']:g} GiB @ {r['max context']:,}", (r["cache at max context (GiB)"], i),
                    va="center", fontsize=7)
    ax.set_xlim(right=ax.get_xlim()[1] * 20)
    handles = [Patch(color=c, label=k) for k, c in colours.items()]
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    return fig


def catalog_export() -> dict:
    """Everything a calculator needs, as plain JSON-able data (for a browser calculator without Python).

    ``models``: per catalog model, the resolved description (layers that cache, per-layer
    windows, vectors cached per token per layer), parameters and source. ``kv_dtypes``:
    bits, group size and metadata bytes per group. ``formula``: how to combine them.
    """
    models = []
    for entry in _catalog():
        spec = entry.spec
        vectors, length = spec.cached_vectors
        models.append({
            "name": entry.name, "hf_id": entry.hf_id, "source": entry.source, "notes": entry.notes,
            "num_parameters": entry.num_parameters, "kind": spec.attention_kind,
            "num_layers": spec.num_layers, "num_heads": spec.num_heads, "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "max_context": spec.max_context,
            "attention_layers": list(spec.attention_layers),
            "sliding_windows": [spec.sliding_windows[i] for i in spec.attention_layers],
            "vectors_per_token_per_layer": vectors, "values_per_vector": length,
            "cross_attention_tokens": spec.cross_attention_tokens,
            "bytes_per_token_fp16": bytes_per_token(spec, "fp16"),
        })
    return {
        "formula": (
            "vector_bytes(n) = ceil(n*bits/8) + ceil(n/group_size)*meta_bytes (no metadata when group_size is null); "
            "layer_token_bytes = vectors_per_token_per_layer * vector_bytes(values_per_vector); "
            "total = batch * layer_token_bytes * (sum over attention layers of min(context, window or context) "
            "+ len(attention_layers) * cross_attention_tokens)"
        ),
        "kv_dtypes": {name: asdict(d) for name, d in KV_DTYPES.items()},
        "models": models,
    }


# --------------------------------------------------------------------------- capacity planning


def weight_bytes(num_parameters: int, dtype: str | KVDtype = "bf16") -> int:
    """Bytes of the weights: parameters x bytes per parameter (integer formats include their scales)."""
    _check_int(num_parameters, "num_parameters", low=1)
    dtype = kv_dtype(dtype)
    if not dtype.group_size:
        return num_parameters * dtype.bits // 8
    groups = -(-num_parameters // dtype.group_size)
    return -(-num_parameters * dtype.bits // 8) + groups * dtype.meta_bytes


def free_bytes(gpu_bytes: int, weights: int, overhead_bytes: int = 0) -> int:
    """Memory left for the KV cache (negative when the weights alone do not fit)."""
    for key, value in (("gpu_bytes", gpu_bytes), ("weight_bytes", weights), ("overhead_bytes", overhead_bytes)):
        _check_int(value, key, low=0)
    return gpu_bytes - weights - overhead_bytes


def max_batch(spec: ModelSpec, context: int, gpu_bytes: int, weights: int, overhead_bytes: int = 0,
              dtype: str | KVDtype = "fp16") -> int:
    """The most sequences of ``context`` tokens whose caches fit beside the weights (0 if none)."""
    free = free_bytes(gpu_bytes, weights, overhead_bytes)
    return max(0, free // cache_bytes(spec, context, 1, dtype))


def max_context(spec: ModelSpec, batch: int, gpu_bytes: int, weights: int, overhead_bytes: int = 0,
                dtype: str | KVDtype = "fp16", limit: int | None = None) -> int:
    """The longest context (up to the model's maximum, or ``limit``) at which ``batch`` caches fit (0 if none)."""
    _check_int(batch, "batch", low=1)
    free = free_bytes(gpu_bytes, weights, overhead_bytes)
    high = limit or spec.max_context
    if high is None:
        raise KVLibError(f"{spec.name} has no maximum context; pass limit=")
    if free < cache_bytes(spec, 1, batch, dtype):
        return 0
    low = 1  # cache size never shrinks with the context, so bisect for the last one that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if cache_bytes(spec, mid, batch, dtype) <= free else (low, mid - 1)
    return low


def capacity_table(spec: ModelSpec, num_parameters: int, gpu_bytes: int, context: int, batch: int = 1,
                   weight_dtype: str = "bf16", overhead_bytes: int = 0, kv_dtypes=("fp16", "fp8", "int8", "int4")) -> list[dict]:
    """Per KV dtype: cache of ``batch`` x ``context``, its share of the GPU, max batch and max context.

    The max context stops at the model's own maximum (``spec.max_context``); the last column
    says whether that or memory set it (chapter 2's capacity table).
    """
    weights = weight_bytes(num_parameters, weight_dtype)
    rows = []
    for name in kv_dtypes:
        size = cache_bytes(spec, context, batch, name)
        longest = max_context(spec, batch, gpu_bytes, weights, overhead_bytes, name)
        capped = spec.max_context is not None and longest == spec.max_context
        rows.append({
            "kv dtype": name, "cache (GiB)": round(size / GiB, 3),
            "GPU share": round((weights + overhead_bytes + size) / gpu_bytes, 3),
            "fits": weights + overhead_bytes + size <= gpu_bytes,
            f"max batch at {context:,}": max_batch(spec, context, gpu_bytes, weights, overhead_bytes, name),
            f"max context at batch {batch}": longest,
            "max context limited by": "model's maximum" if capped else "memory" if longest else "does not fit",
        })
    return rows


# --------------------------------------------------------------------------- command line


def size_summary(model: str | Path, context: int, batch: int = 1, dtype: str = "fp16") -> dict:
    """What ``python -m kvlib size`` reports, as one JSON-able object."""
    spec = resolve_model(model)
    size = cache_size(spec, context, batch, dtype)
    vectors, length = spec.cached_vectors
    return {
        "model": spec.name, "kind": spec.attention_kind, "context": context, "batch": batch,
        "kv_dtype": kv_dtype(dtype).name, "kv_dtype_format": kv_dtype(dtype).describe(),
        "num_layers": spec.num_layers, "num_attention_layers": spec.num_attention_layers,
        "num_kv_heads": spec.num_kv_heads if not spec.is_mla else 1, "head_dim": length,
        "vectors_per_token_per_layer": vectors,
        "sliding_window_layers": sum(spec.sliding_windows[i] is not None for i in spec.attention_layers),
        "cross_attention_tokens": spec.cross_attention_tokens,
        "bytes_per_token": size.bytes_per_token,
        "self_attention_bytes": size.self_attention_bytes, "cross_attention_bytes": size.cross_attention_bytes,
        "total_bytes": size.total_bytes,
    }


def format_summary(summary: dict) -> str:
    """The short human-readable table of ``python -m kvlib size``."""
    s = summary
    heads = "one latent vector (MLA)" if s["kind"] == "MLA" else f"{s['num_kv_heads']} KV heads (K and V)"
    lines = [
        ("model", f"{s['model']} ({s['kind']})"),
        ("layers", f"{s['num_attention_layers']} with a KV cache of {s['num_layers']}"
                   + (f", {s['sliding_window_layers']} with a sliding window" if s["sliding_window_layers"] else "")),
        ("per layer", f"{heads} x {s['head_dim']} values per token"),
        ("kv dtype", s["kv_dtype_format"]),
        ("per token", f"{s['bytes_per_token']:,} B ({s['bytes_per_token'] / 1024:,.1f} KiB)"),
        ("context", f"{s['context']:,} tokens x batch {s['batch']}"),
    ]
    if s["cross_attention_bytes"]:
        lines.append(("self-attn", _bytes(s["self_attention_bytes"])))
        lines.append(("cross-attn", _bytes(s["cross_attention_bytes"]) + f" ({s['cross_attention_tokens']:,} encoder positions)"))
    lines.append(("total", _bytes(s["total_bytes"])))
    return "\n".join(f"{key:<11}{value}" for key, value in lines)


def _bytes(n: int) -> str:
    return f"{n:,} B ({n / GiB:,.3f} GiB)"
