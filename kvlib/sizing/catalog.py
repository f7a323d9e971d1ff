"""The real models shipped with kvlib, one JSON file each in ``kvlib/sizing/configs/`` (chapter 2).

Each file quotes the fields of the model's published ``config.json`` that the cache and
the parameter count depend on, and says where they come from (the fields are described in
``kvlib/sizing/configs/README.md``). :func:`catalog_entry` reads one into a
:class:`CatalogEntry` (its :class:`~kvlib.sizing.spec.ModelSpec` built by
:func:`~kvlib.sizing.config_reader.spec_from_config`), :func:`resolve_model` accepts a
catalog name or a path to any ``config.json`` (as ``python -m kvlib size`` does), and
:func:`catalog_table` is chapter 2's table of every model's cache at its maximum context.
:func:`catalog_export` gives the whole catalog as plain JSON-able data for the online
calculator (:mod:`kvlib.sizing.web_calculator`), which has no Python.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from kvlib import KVLibError
from kvlib.sizing.config_reader import load_config, path_kind, spec_from_config
from kvlib.sizing.dtypes import KV_DTYPES, KVDtype
from kvlib.sizing.spec import ModelSpec, bytes_per_token, cache_size


@dataclass(frozen=True)
class CatalogEntry:
    """One model of ``kvlib/sizing/configs/``: its description and where the numbers come from."""

    name: str  # display name, as python -m kvlib size accepts it (case-insensitive)
    hf_id: str  # the model's Hugging Face repository
    source: str  # where the config's numbers come from
    notes: str  # what bends the size formula for this model (windows, MLA, ...)
    num_parameters: int  # parameter count, for the weights' bytes
    parameters_source: str  # how num_parameters was obtained
    spec: ModelSpec = field(repr=False)
    config: dict = field(repr=False, compare=False)  # the config.json fields the file quotes


def catalog_names() -> list[str]:
    """Names of the shipped models, in catalog order."""
    return [entry.name for entry in _catalog()]


@lru_cache(maxsize=1)
def _catalog() -> tuple[CatalogEntry, ...]:
    entries = []
    for item in sorted(resources.files("kvlib.sizing").joinpath("configs").iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            data = json.loads(item.read_text(encoding="utf-8"))
            spec = spec_from_config(data["config"], name=data["name"], max_context=data.get("max_context"))
            entries.append(
                CatalogEntry(
                    data["name"],
                    data["hf_id"],
                    data["source"],
                    data.get("notes", ""),
                    data["num_parameters"],
                    data["parameters_source"],
                    spec,
                    data["config"],
                )
            )
    return tuple(sorted(entries, key=lambda e: _catalog_position(e.name)))


# Display order of the catalog (the order chapter 2 discusses the models); other files sort last.
CATALOG_ORDER = (
    "Llama-2-7B",
    "Llama-2-70B",
    "Llama-3-8B",
    "Llama-3-70B",
    "Mistral-7B-v0.1",
    "Mixtral-8x7B",
    "Falcon-7B",
    "Qwen2.5-7B",
    "Gemma-2-9B",
    "DeepSeek-V3",
    "Jamba-v0.1",
    "Whisper-large-v3",
    "OPT-13B",
)


def _catalog_position(name: str) -> int:
    return CATALOG_ORDER.index(name) if name in CATALOG_ORDER else len(CATALOG_ORDER)


def catalog_entry(name: str) -> CatalogEntry:
    """A catalog model by name (case-insensitive); unknown names get the closest matches."""
    if not isinstance(name, str):
        raise KVLibError(f"a catalog name must be a string, not {type(name).__name__}")
    by_name = {entry.name.lower(): entry for entry in _catalog()}
    if name.lower() in by_name:
        return by_name[name.lower()]
    if len(name) > 200:  # no catalog name comes near; difflib and the message stay short
        raise KVLibError(
            f"unknown model {name[:40]!r}... ({len(name)} characters); "
            f"choose from {', '.join(catalog_names())}"
        )
    close = difflib.get_close_matches(name.lower(), list(by_name), n=3, cutoff=0.4)
    hint = (
        f"; did you mean {', '.join(by_name[c].name for c in close)}?"
        if close
        else f"; choose from {', '.join(catalog_names())}"
    )
    raise KVLibError(f"unknown model {name!r}{hint}")


def catalog_config(name: str) -> dict:
    """A copy of the ``config.json`` fields a catalog file quotes, for keys ModelSpec does not
    keep (Mamba's, in chapter 5) and for exercises that feed a raw config to the reader's code."""
    return dict(catalog_entry(name).config)


def resolve_model(
    model: str | Path, encoder_tokens: int | None = None, image_tokens: int | None = None
) -> ModelSpec:
    """A catalog name, or a path to a ``config.json`` or its folder.

    Anything with a path separator, a ``.json`` suffix (in any case) or that exists on disk
    is a path, so that a missing ``config.JSON`` is reported as a missing file, not as an
    unknown model name. ``encoder_tokens`` and ``image_tokens`` override the cross-attention
    lengths the reader would assume (:func:`~kvlib.sizing.config_reader.spec_from_config`);
    a catalog model is then read again from its config with them.
    """
    if not isinstance(model, (str, Path)):
        raise KVLibError(f"a model must be a catalog name or a path, not {type(model).__name__}")
    text = str(model)
    if not text.strip():
        raise KVLibError("a model name must not be empty: give a catalog name or a config.json path")
    path = Path(text)
    lengths = {"encoder_tokens": encoder_tokens, "image_tokens": image_tokens}
    if _is_path(text):
        return spec_from_config(path, name=path.name, **lengths)
    entry = catalog_entry(text)
    if encoder_tokens is None and image_tokens is None:
        return entry.spec
    return spec_from_config(
        dict(entry.config), name=entry.name, max_context=entry.spec.max_context, **lengths
    )


def _is_path(text: str) -> bool:
    return (
        text.lower().endswith(".json")
        or "/" in text
        or "\\" in text
        or path_kind(Path(text)) in ("file", "directory")
    )


def model_config(model: str | Path) -> dict:
    """The raw ``config.json`` of what :func:`resolve_model` accepts: a catalog model's quoted
    fields, or the file at a path (``--verbose`` lists the keys of it that kvlib ignores)."""
    if not isinstance(model, (str, Path)) or not str(model).strip():
        raise KVLibError(f"a model must be a catalog name or a path, not {model!r:.60}")
    return load_config(Path(str(model))) if _is_path(str(model)) else catalog_config(str(model))


def catalog_table(dtype: str | KVDtype = "fp16") -> list[dict]:
    """One row per catalog model: its cache at its maximum context, batch 1."""
    rows = []
    for entry in _catalog():
        spec = entry.spec
        size = cache_size(spec, spec.max_context, 1, dtype)
        rows.append(
            {
                "model": entry.name,
                "kind": spec.attention_kind,
                "attention layers": f"{spec.num_attention_layers}/{spec.num_layers}",
                "kv heads": spec.num_kv_heads if not spec.is_mla else "latent",
                "head_dim": spec.head_dim if not spec.is_mla else spec.cached_vectors[1],
                "bytes/token": size.bytes_per_token,
                "max context": spec.max_context,
                "cache at max context (GiB)": round(size.total_gib, 3),
            }
        )
    return rows


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
        models.append(
            {
                "name": entry.name,
                "hf_id": entry.hf_id,
                "source": entry.source,
                "notes": entry.notes,
                "num_parameters": entry.num_parameters,
                "kind": spec.attention_kind,
                "num_layers": spec.num_layers,
                "num_heads": spec.num_heads,
                "num_kv_heads": spec.num_kv_heads,
                "head_dim": spec.head_dim,
                "max_context": spec.max_context,
                "attention_layers": list(spec.attention_layers),
                "sliding_windows": [spec.sliding_windows[i] for i in spec.attention_layers],
                "vectors_per_token_per_layer": vectors,
                "values_per_vector": length,
                "cross_attention_tokens": spec.cross_attention_tokens,
                "bytes_per_token_fp16": bytes_per_token(spec, "fp16"),
            }
        )
    return {
        "formula": (
            "vector_bytes(n) = ceil(n*bits/8) + ceil(n/group_size)*meta_bytes "
            "(no metadata when group_size is null); "
            "layer_token_bytes = vectors_per_token_per_layer * vector_bytes(values_per_vector); "
            "total = batch * layer_token_bytes * (sum over attention layers of "
            "min(context, window or context) "
            "+ len(attention_layers) * cross_attention_tokens)"
        ),
        "kv_dtypes": {name: asdict(d) for name, d in KV_DTYPES.items()},
        "models": models,
    }
