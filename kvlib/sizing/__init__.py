"""How big the KV cache is, for any model on any GPU (chapter 2; chapters 3 to 6 reuse it).

Pure arithmetic on integers: nothing here imports torch (only :mod:`kvlib.units` of the rest
of kvlib), so the sizes are exact and every later layer can use them.

- ``dtypes``: the storage formats of K and V (fp32 ... int4 with its scales) and the bytes of
  one stored vector.
- ``spec``: :class:`ModelSpec` (what the cache of a model depends on) and the byte formulas,
  ``2 x layers x kv_heads x head_dim x tokens x batch x bytes`` and the five ways real
  models bend it (GQA/MQA, sliding windows, hybrids, MLA, encoder-decoders).
- ``layer_groups``: a layer stack as repeated patterns (no size loops over layers).
- ``config_keys``, ``layer_pattern``, ``config_reader``: a Hugging Face ``config.json`` to a
  :class:`ModelSpec` (every layer-pattern spelling; unknown size-relevant keys refused).
- ``parallel``: one GPU's cache under tensor and pipeline parallelism, as vLLM lays it out.
- ``catalog``: the real models shipped in ``configs/`` (each quoting its source), their
  table, and their export as JSON for the browser.
- ``capacity``: weights, free memory, largest batch and context on one GPU, and the report
  of ``python -m kvlib size``.
- ``widget``: the notebook's ipywidgets calculator and its static table.
- ``web_calculator``: the calculator of the online book, as HTML plus ``web/calculator.js``.
"""

from kvlib.sizing.capacity import (
    capacity_table,
    format_bytes_gib,
    format_summary,
    free_bytes,
    max_batch,
    max_context,
    size_summary,
    weight_bytes,
)
from kvlib.sizing.catalog import (
    CATALOG_ORDER,
    CatalogEntry,
    catalog_config,
    catalog_entry,
    catalog_export,
    catalog_names,
    catalog_table,
    resolve_model,
)
from kvlib.sizing.config_reader import load_config, spec_from_config, spec_from_model_config
from kvlib.sizing.dtypes import KV_DTYPES, KVDtype, kv_dtype
from kvlib.sizing.layer_pattern import NON_ATTENTION_LAYER_TYPES
from kvlib.sizing.parallel import (
    check_parallel,
    kv_heads_per_gpu,
    per_gpu_bytes,
    pp_layer_ranges,
    stage_bytes,
)
from kvlib.sizing.spec import (
    CacheSize,
    ModelSpec,
    article_table,
    bytes_per_token,
    cache_bytes,
    cache_size,
    cached_tokens,
    check_context,
    kv_cache_bytes,
    require_int,
    token_layer_bytes,
)
from kvlib.sizing.web_calculator import (
    DEFAULTS,
    KV_CHOICES,
    LIMITS,
    STYLE,
    WEIGHT_CHOICES,
    answer_rows,
    calculator_html,
    embedded_json,
    script_source,
)
from kvlib.sizing.widget import calculator, capacity_overview, capacity_report, report_html

__all__ = [
    "stage_bytes",
    "pp_layer_ranges",
    "per_gpu_bytes",
    "kv_heads_per_gpu",
    "check_parallel",
    "CATALOG_ORDER",
    "CacheSize",
    "CatalogEntry",
    "DEFAULTS",
    "KVDtype",
    "KV_CHOICES",
    "KV_DTYPES",
    "LIMITS",
    "ModelSpec",
    "NON_ATTENTION_LAYER_TYPES",
    "STYLE",
    "WEIGHT_CHOICES",
    "answer_rows",
    "article_table",
    "bytes_per_token",
    "cache_bytes",
    "cache_size",
    "cached_tokens",
    "calculator",
    "calculator_html",
    "capacity_overview",
    "capacity_report",
    "capacity_table",
    "catalog_config",
    "catalog_entry",
    "catalog_export",
    "catalog_names",
    "catalog_table",
    "check_context",
    "embedded_json",
    "format_bytes_gib",
    "format_summary",
    "free_bytes",
    "kv_cache_bytes",
    "kv_dtype",
    "load_config",
    "max_batch",
    "max_context",
    "report_html",
    "require_int",
    "resolve_model",
    "script_source",
    "size_summary",
    "spec_from_config",
    "spec_from_model_config",
    "token_layer_bytes",
    "weight_bytes",
]
