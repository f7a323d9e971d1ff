"""The chapter 2 calculator for the online book: HTML and a short script, no Python kernel needed.

:func:`kvlib.sizing.widget.calculator` is an ipywidgets calculator, and widgets need a
running kernel, which the published HTML does not have. :func:`calculator_html` renders the
same calculator as one self-contained HTML fragment: a form, the catalog as JSON
(:func:`kvlib.sizing.catalog.catalog_export`, embedded: nothing is fetched) and
``kvlib/sizing/web/calculator.js``, which repeats kvlib's arithmetic with exact integers.

:func:`answer_rows` is the Python side: the rows the calculator shows, computed by kvlib and
formatted as the script formats them. The fragment is pre-filled with it (the default answer
shows even without JavaScript), and the browser tests (``tests/browser/test_calculator.py``)
check that the script displays exactly these rows for the same inputs.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from kvlib import KVLibError
from kvlib.sizing.capacity import format_bytes_gib, weight_bytes
from kvlib.sizing.catalog import catalog_entry, catalog_export, catalog_names
from kvlib.sizing.spec import cache_size, token_layer_bytes
from kvlib.sizing.widget import LIMITS, calculator_report

# The widget's choices (kvlib.sizing.widget.calculator); its bounds are kvlib.sizing.widget.LIMITS.
KV_CHOICES = ("fp16", "bf16", "fp8", "int8", "int4")

WEIGHT_CHOICES = ("bf16", "fp8", "int4")

DEFAULTS = {
    "model": "Llama-3-8B",
    "context": 8192,
    "batch": 8,
    "kv_dtype": "fp16",
    "gpu_gib": 80.0,
    "weight_dtype": "bf16",
    "overhead_gib": 4.0,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
}


def _parallel_rows(report: dict, batch: int) -> list[tuple[str, str, str]]:
    """The rows a TP x PP layout adds: the fullest GPU's cache, and what one GPU of it holds."""
    r = report
    heads = (
        "the MLA latent (replicated on every GPU)"
        if r["is_mla"]
        else f"{r['kv_heads_per_gpu']:,} of the {r['num_kv_heads']:,} KV heads per layer"
    )
    return [
        (
            "per_gpu",
            "per GPU",
            f"{format_bytes_gib(r['per_gpu_bytes'])} for {batch:,} sequences on the fullest of "
            f"{r['num_gpus']:,} GPUs (tensor_parallel_size {r['tensor_parallel_size']:,} x "
            f"pipeline_parallel_size {r['pipeline_parallel_size']:,})",
        ),
        ("kv_heads_per_gpu", "each GPU", f"{heads} x {r['layers_per_gpu']:,} layers"),
    ]


def answer_rows(
    model: str,
    context: int,
    batch: int,
    kv_dtype: str = "fp16",
    gpu_gib: float = 80.0,
    weight_dtype: str = "bf16",
    overhead_gib: float = 4.0,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
) -> list[tuple[str, str, str]]:
    """(key, label, text) per row of the calculator's answer: cache per token, per sequence and
    for the batch, weights, the GPU share, max batch and max context (as kvlib computes them).

    On more than one GPU (``tensor_parallel_size x pipeline_parallel_size``) the GPU memory and
    overhead are per GPU, two rows give the fullest GPU's cache and what one GPU holds, and the
    share, max batch and max context are that GPU's (:func:`kvlib.sizing.widget.capacity_report`).
    """
    report = calculator_report(
        model=model,
        context=context,
        batch=batch,
        kv_dtype=kv_dtype,
        gpu_gib=gpu_gib,
        weight_dtype=weight_dtype,
        overhead_gib=overhead_gib,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
    )
    entry = catalog_entry(model)
    spec = entry.spec
    one = cache_size(spec, context, 1, kv_dtype)
    layer = token_layer_bytes(spec, kv_dtype)
    cross = f", of which {one.cross_attention_bytes:,} B cross-attention" if one.cross_attention_bytes else ""
    batch_bytes = cache_size(spec, context, batch, kv_dtype).total_bytes
    verdict = "fits" if report["fits"] else "does NOT fit"
    several = report["num_gpus"] > 1
    weights = f"{format_bytes_gib(weight_bytes(entry.num_parameters, weight_dtype))} ({weight_dtype})"
    if several:
        weights += f", {format_bytes_gib(report['weight_bytes_per_gpu'])} per GPU"
    rows = [
        (
            "per_token",
            "per token",
            f"{one.bytes_per_token:,} B = {spec.num_attention_layers} attention layers x {layer:,} B",
        ),
        ("per_sequence", "one sequence", f"{format_bytes_gib(one.total_bytes)} at {context:,} tokens{cross}"),
        ("batch", "the batch", f"{format_bytes_gib(batch_bytes)} for {batch:,} sequences"),
        *(_parallel_rows(report, batch) if several else []),
        ("weights", "weights", weights),
        (
            "gpu_share",
            "GPU memory",
            f"{report['gpu_fraction']:,.1%} used{' on the fullest GPU' if several else ''}: {verdict}",
        ),
        ("max_batch", "max batch", f"{report['max_batch']:,} sequences of {context:,} tokens"),
        (
            "max_context",
            "max context",
            f"{report['max_context']:,} tokens at batch {batch:,} "
            f"(model maximum {report['model_max_context']:,})",
        ),
    ]
    return rows


def script_source() -> str:
    """The text of kvlib/sizing/web/calculator.js: the calculator's arithmetic and its page logic."""
    return resources.files("kvlib.sizing").joinpath("web", "calculator.js").read_text(encoding="utf-8")


def embedded_json(data) -> str:
    """JSON that can sit inside a <script> element ("</script>" in a string would end it early)."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


# The fragment's CSS, one rule per line.
STYLE = "\n".join(
    (
        ".kvcalc form { display: grid; grid-template-columns: repeat(auto-fill, minmax(13rem, 1fr)); "
        "gap: .4rem 1rem; }",
        ".kvcalc label { display: flex; flex-direction: column; font-size: .85rem; }",
        ".kvcalc .kvcalc-error { color: #b00020; font-weight: bold; min-height: 1.2em; }",
        ".kvcalc th { text-align: left; padding-right: 1rem; }",
    )
)


def _options(choices, selected) -> str:
    return "".join(
        f"<option{' selected' if c == selected else ''}>{html.escape(c)}</option>" for c in choices
    )


def calculator_html(**inputs) -> str:
    """The calculator as one HTML fragment (form, catalog JSON, script), pre-filled with ``inputs``
    (defaults: :data:`DEFAULTS`). Deterministic, so a notebook can store it as a checked output."""
    values = {**DEFAULTS, **inputs}
    unknown = set(values) - set(DEFAULTS)
    if unknown:
        raise KVLibError(f"unknown calculator inputs: {', '.join(sorted(unknown))}")
    rows = "".join(
        f'<tr data-out="{key}"><th>{label}</th><td>{html.escape(text)}</td></tr>'
        for key, label, text in answer_rows(**values)
    )
    v = values
    fields = [
        f'<label>model<select name="model">{_options(catalog_names(), v["model"])}</select></label>',
        '<label>context (tokens)<input type="number" name="context" min="1" step="1" '
        f'value="{v["context"]}"></label>',
        f'<label>batch (sequences)<input type="number" name="batch" min="1" max="{LIMITS["batch"]}" step="1" '
        f'value="{v["batch"]}"></label>',
        f'<label>KV dtype<select name="kv_dtype">{_options(KV_CHOICES, v["kv_dtype"])}</select></label>',
        '<label>GPU memory per GPU (GiB)<input type="number" name="gpu_gib" min="0" '
        f'max="{LIMITS["gpu_gib"]}" step="any" value="{float(v["gpu_gib"])!r}"></label>',
        '<label>weights<select name="weight_dtype">'
        f"{_options(WEIGHT_CHOICES, v['weight_dtype'])}</select></label>",
        '<label>overhead (GiB)<input type="number" name="overhead_gib" min="0" '
        f'max="{LIMITS["overhead_gib"]}" step="any" value="{float(v["overhead_gib"])!r}"></label>',
        *(
            f'<label>{label}<input type="number" name="{key}" min="1" max="{LIMITS[key]}" step="1" '
            f'value="{v[key]}"></label>'
            for key, label in (
                ("tensor_parallel_size", "--tensor-parallel-size (GPUs per layer)"),
                ("pipeline_parallel_size", "--pipeline-parallel-size (stages)"),
            )
        ),
    ]
    return (
        '<div class="kvcalc">\n'
        f"<style>\n{STYLE}\n</style>\n"
        "<p><b>KV-cache calculator</b> (it runs in your browser: no Python needed)</p>\n"
        f"<form>{''.join(fields)}</form>\n"
        '<p class="kvcalc-error" role="alert"></p>\n'
        f'<table class="kvcalc-answer"><tbody>{rows}</tbody></table>\n'
        f'<script type="application/json" class="kvcalc-data">{embedded_json(catalog_export())}</script>\n'
        f"<script>\n{script_source()}</script>\n"
        "</div>"
    )
