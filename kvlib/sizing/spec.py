"""What the KV cache of a model depends on (:class:`ModelSpec`) and its exact byte counts (chapter 2).

The cache of one attention layer holds, for every cached token, one key and one value
vector per KV head, so the whole cache is

    bytes = 2 x num_attention_layers x num_kv_heads x head_dim x tokens x batch x bytes_per_value

(the formula of the source article of this book, :func:`kv_cache_bytes`). Real models bend
it in five ways, all handled here from a single description, :class:`ModelSpec`:

- **GQA / MQA**: ``num_kv_heads`` below ``num_heads`` (MQA: one).
- **Sliding-window layers** (Mistral, Gemma-2): such a layer never caches more than its
  window, ``min(tokens, window)`` tokens.
- **Hybrid models** (Jamba, Bamba, Nemotron-H): only some layers are attention layers; the
  others keep a fixed-size state and no KV cache. Llama-4's chunked layers cache at most
  a chunk; Llama-3.2-Vision's cross-attention layers cache a fixed number of image tokens.
- **MLA** (DeepSeek-V2/V3): each layer caches one latent vector of
  ``kv_lora_rank + qk_rope_head_dim`` values per token, shared by all heads, instead of
  K and V per head.
- **Encoder-decoder models** (Whisper): every decoder layer also caches the cross-attention
  K and V of all encoder positions, computed once per input and not growing with the output.

The bytes of one stored vector come from its :class:`~kvlib.sizing.dtypes.KVDtype` (fp16,
fp8, int8 and int4 with their scales). :func:`cache_size` splits a cache into its
self-attention and cross-attention parts, :func:`cache_bytes` is their total, and
:func:`bytes_per_token` is what one more token adds. The layer stack is kept as repeated
patterns (:mod:`kvlib.sizing.layer_groups`), so no size is computed layer by layer or
token by token: a config claiming 10**12 layers is sized at once; :func:`stack_bytes`
sizes any range of layers (a pipeline stage, :mod:`kvlib.sizing.parallel`). A :class:`ModelSpec` is built by
hand, from a Hugging Face ``config.json`` (:mod:`kvlib.sizing.config_reader`) or from the
real models shipped in ``kvlib/sizing/configs/`` (:mod:`kvlib.sizing.catalog`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.sizing.dtypes import KVDtype, kv_dtype
from kvlib.sizing.layer_groups import (
    FULL_ATTENTION,
    MAX_LISTED_LAYERS,
    AttentionLayers,
    LayerGroups,
    LayerKind,
    SlidingWindows,
    groups_from_lists,
    require_count,
)
from kvlib.units import GiB


@dataclass(frozen=True)
class ModelSpec:
    """What the KV cache of a model depends on (its weights do not matter here).

    ``num_layers`` counts the layers that run once per generated token (the decoder's, for
    an encoder-decoder model). Which of them keep a KV cache, and how many tokens each
    keeps, is ``layer_groups`` (:class:`~kvlib.sizing.layer_groups.LayerGroups`: repeated
    patterns, so that no size computation loops over layers); for hand-built specs,
    ``attention_layers`` (indices of the layers that cache; default all) and
    ``sliding_windows`` (per layer, the window that caps its cache, or ``None``) say the
    same as per-layer tuples. After construction both are read-only sequence views of
    ``layer_groups``. MLA models set ``kv_lora_rank`` and ``qk_rope_head_dim``.
    Encoder-decoder models set ``cross_attention_tokens`` (encoder positions every decoder
    layer caches) and ``num_encoder_layers`` (which cache nothing).
    """

    name: str  # display name ("Llama-3-8B")
    num_layers: int  # layers run per generated token (the decoder's)
    num_heads: int  # query heads
    num_kv_heads: int  # K/V heads: num_heads (MHA), fewer (GQA), 1 (MQA); the most of any layer
    head_dim: int  # values per head vector
    attention_layers: Sequence[int] | None = None  # indices of the layers that cache K/V; None: all
    sliding_windows: Sequence[int | None] | None = None  # per layer: window in tokens, or None
    kv_lora_rank: int | None = None  # MLA: latent values cached per token and layer
    qk_rope_head_dim: int | None = None  # MLA: rotary key values cached beside the latent
    cross_attention_tokens: int = 0  # encoder positions each decoder layer caches (encoder-decoder)
    num_encoder_layers: int = 0  # encoder layers (they cache nothing)
    max_context: int | None = None  # longest context the model accepts, when known
    layer_groups: LayerGroups | None = None  # the layer stack as repeated patterns; None: from the above

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise KVLibError(f"a ModelSpec's name must be a string, not {type(self.name).__name__}")
        for key in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
            require_count(getattr(self, key), key, low=1)
        for key in ("cross_attention_tokens", "num_encoder_layers"):
            require_count(getattr(self, key), key, low=0)
        if self.max_context is not None:
            require_count(self.max_context, "max_context", low=1)
        if self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads:
            raise KVLibError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        groups = self._groups()
        if groups.num_layers != self.num_layers:
            raise KVLibError(f"layer_groups describe {groups.num_layers:,} layers, not {self.num_layers:,}")
        kinds = list(groups.counts())
        if not any(kind.caches for kind in kinds):
            raise KVLibError(
                f"{self.name} has no attention layer: none of its {self.num_layers:,} layers keeps a KV cache"
            )
        for kind in kinds:
            _check_kind(kind)
        object.__setattr__(self, "layer_groups", groups)
        object.__setattr__(self, "attention_layers", AttentionLayers(groups))
        object.__setattr__(self, "sliding_windows", SlidingWindows(groups))
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise KVLibError("MLA needs both kv_lora_rank and qk_rope_head_dim")
        if self.is_mla:
            require_count(self.kv_lora_rank, "kv_lora_rank", low=1)
            require_count(self.qk_rope_head_dim, "qk_rope_head_dim", low=1)

    def _groups(self) -> LayerGroups:
        """The layer stack: ``layer_groups`` as given, or built from the per-layer tuples."""
        groups = self.layer_groups
        if groups is not None and not isinstance(groups, LayerGroups):
            raise KVLibError(f"layer_groups must be a LayerGroups, not {type(groups).__name__}")

        def is_view(value) -> bool:
            return value is None or (groups is not None and getattr(value, "groups", None) == groups)

        if groups is not None and is_view(self.attention_layers) and is_view(self.sliding_windows):
            return groups
        if self.attention_layers is None and self.sliding_windows is None:
            return LayerGroups.uniform(FULL_ATTENTION, self.num_layers)
        return groups_from_lists(
            self.num_layers, self.attention_layers, self.sliding_windows, groups, MAX_LISTED_LAYERS
        )

    @property
    def num_attention_layers(self) -> int:
        """How many layers keep a KV cache (all of them, except in hybrid models)."""
        return len(self.attention_layers)

    @property
    def is_mla(self) -> bool:
        """Whether each layer caches one latent vector per token (MLA) instead of K and V per head."""
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
        return replace(
            self,
            num_kv_heads=num_kv_heads,
            name=name or self.name,
            layer_groups=self.layer_groups.with_each(num_kv_heads=None),
        )


def _check_kind(kind: LayerKind) -> None:
    """A layer kind's own numbers must be sound (the reader checks configs; this checks hand-built stacks)."""
    if kind.window is not None:
        require_count(kind.window, "sliding_window", low=1)
    if kind.fixed_tokens is not None:
        require_count(kind.fixed_tokens, "fixed_tokens", low=0)
    if kind.num_kv_heads is not None:
        require_count(kind.num_kv_heads, "a layer's num_kv_heads", low=1)


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, batch: int = 1, dtype_bytes: int = 2
) -> int:
    """The plain formula 2 x L x H_kv x D_head x S x B x bytes (no windows, no hybrids, no MLA)."""
    for key, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("seq_len", seq_len),
        ("batch", batch),
        ("dtype_bytes", dtype_bytes),
    ):
        require_count(value, key, low=1)
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch * dtype_bytes


def token_layer_bytes(spec: ModelSpec, dtype: str | KVDtype = "fp16") -> int:
    """Bytes one token occupies in one attention layer's cache (with the model's num_kv_heads)."""
    require_spec(spec)
    vectors, length = spec.cached_vectors
    return vectors * kv_dtype(dtype).vector_bytes(length)


def kind_token_bytes(
    spec: ModelSpec, kind: LayerKind, dtype: str | KVDtype = "fp16", heads_per_rank=None
) -> int:
    """Bytes one token occupies in one layer of ``kind`` (its own KV heads, when it has them).

    ``heads_per_rank`` maps a layer's KV heads to those one tensor-parallel rank holds
    (:func:`kvlib.sizing.parallel.kv_heads_per_gpu`); an MLA latent is never split.
    """
    if spec.is_mla:
        return token_layer_bytes(spec, dtype)
    heads = kind.num_kv_heads or spec.num_kv_heads
    if heads_per_rank is not None:
        heads = heads_per_rank(heads)
    return 2 * heads * kv_dtype(dtype).vector_bytes(spec.head_dim)


def bytes_per_token(spec: ModelSpec, dtype: str | KVDtype = "fp16") -> int:
    """Bytes one more token adds to the self-attention cache while it is shorter than every window."""
    require_spec(spec)
    dtype = kv_dtype(dtype)
    return sum(
        n * kind_token_bytes(spec, kind, dtype)
        for kind, n in spec.layer_groups.counts().items()
        if kind.caches and kind.fixed_tokens is None
    )


def cached_tokens(spec: ModelSpec, layer: int, context: int) -> int:
    """How many of ``context`` tokens layer ``layer`` keeps: all, at most its window, or a fixed number."""
    require_spec(spec)
    require_int(layer, "layer", low=0, high=spec.num_layers - 1)
    require_count(context, "context", low=0)
    return spec.layer_groups.kind_of(layer).tokens(context)


def check_context(spec: ModelSpec, context: int, allow_beyond_max: bool = False) -> bool:
    """A context must be a positive integer; returns whether it exceeds the model's maximum.

    Beyond the maximum is an error unless ``allow_beyond_max`` (people size RoPE-scaled,
    e.g. YaRN-extended, contexts: ``python -m kvlib size`` computes them and warns).
    """
    require_count(context, "context", low=1)
    beyond = spec.max_context is not None and context > spec.max_context
    if beyond and not allow_beyond_max:
        raise KVLibError(f"context {context:,} exceeds {spec.name}'s maximum of {spec.max_context:,} tokens")
    return beyond


def stack_bytes(
    spec: ModelSpec,
    counts: dict,
    context: int,
    batch: int,
    dtype: str | KVDtype = "fp16",
    heads_per_rank=None,
) -> tuple[int, int]:
    """(self-attention, cross-attention) bytes of the layers ``counts`` gives ({kind: layers}).

    Self-attention: each layer's tokens (all, or at most its window). Cross-attention: the
    encoder positions every decoder layer caches (Whisper) plus the fixed tokens of
    cross-attention layers (Llama-3.2-Vision's image tokens). One pass over the kinds,
    none over layers or tokens.
    """
    self_bytes = cross_bytes = 0
    for kind, n in counts.items():
        if not kind.caches:
            continue
        token_bytes = batch * n * kind_token_bytes(spec, kind, dtype, heads_per_rank)
        if kind.fixed_tokens is not None:
            cross_bytes += kind.fixed_tokens * token_bytes
        else:
            self_bytes += kind.tokens(context) * token_bytes
            cross_bytes += spec.cross_attention_tokens * token_bytes
    return self_bytes, cross_bytes


@dataclass(frozen=True)
class CacheSize:
    """Bytes of the KV cache of ``batch`` sequences of ``context`` tokens, split by kind."""

    model: str  # the ModelSpec's name
    context: int  # tokens per sequence (prompt + generated)
    batch: int  # sequences
    kv_dtype: str  # name of the KVDtype the values are stored in
    bytes_per_token: int  # what one more token adds, before any window cap
    self_attention_bytes: int  # grows with the context (up to each layer's window)
    cross_attention_bytes: int  # fixed: encoder positions, image tokens (encoder-decoder, vision; else 0)
    exceeds_max_context: bool = False  # the context is beyond the model's maximum (allowed on request)

    @property
    def total_bytes(self) -> int:
        """Self-attention plus cross-attention bytes."""
        return self.self_attention_bytes + self.cross_attention_bytes

    @property
    def total_gib(self) -> float:
        """:attr:`total_bytes` in GiB."""
        return self.total_bytes / GiB


def require_spec(spec) -> None:
    """Raise :class:`~kvlib.KVLibError` unless ``spec`` is a :class:`ModelSpec` (not a name, not None)."""
    if not isinstance(spec, ModelSpec):
        raise KVLibError(
            "expected a ModelSpec (e.g. sizing.catalog_entry(name).spec), "
            f"not {type(spec).__name__} {spec!r:.60}"
        )


def cache_size(
    spec: ModelSpec,
    context: int,
    batch: int = 1,
    dtype: str | KVDtype = "fp16",
    allow_beyond_max: bool = False,
) -> CacheSize:
    """The KV cache of ``batch`` sequences that have ``context`` tokens each (prompt + generated)."""
    require_spec(spec)
    beyond = check_context(spec, context, allow_beyond_max)
    require_count(batch, "batch", low=1)
    dtype = kv_dtype(dtype)
    self_bytes, cross_bytes = stack_bytes(spec, spec.layer_groups.counts(), context, batch, dtype)
    return CacheSize(
        model=spec.name,
        context=context,
        batch=batch,
        kv_dtype=dtype.name,
        bytes_per_token=bytes_per_token(spec, dtype),
        self_attention_bytes=self_bytes,
        cross_attention_bytes=cross_bytes,
        exceeds_max_context=beyond,
    )


def cache_bytes(
    spec: ModelSpec,
    context: int,
    batch: int = 1,
    dtype: str | KVDtype = "fp16",
    allow_beyond_max: bool = False,
) -> int:
    """Total bytes of :func:`cache_size` (self-attention plus cross-attention)."""
    return cache_size(spec, context, batch, dtype, allow_beyond_max).total_bytes


def article_table(context: int = 262_144, kv_heads=(32, 8, 4, 1)) -> list[dict]:
    """The source article's table: 32 layers, hidden 4096, 32 heads (head_dim 128), fp16, batch 1."""
    base = ModelSpec("article model", num_layers=32, num_heads=32, num_kv_heads=32, head_dim=4096 // 32)
    rows = []
    for heads in kv_heads:
        spec = base.with_kv_heads(heads)
        size = cache_bytes(spec, context)
        rows.append(
            {
                "scheme": spec.attention_kind + (f"-{heads}" if spec.attention_kind == "GQA" else ""),
                "num_kv_heads": heads,
                "bytes": size,
                "GB (1024^3 B)": round(size / GiB, 1),
            }
        )
    return rows
