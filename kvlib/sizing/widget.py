"""The notebook's KV-cache calculator: chapter 2's sizing for any catalog model, GPU and KV dtype.

:func:`capacity_report` does the arithmetic for a :class:`~kvlib.sizing.deployment.Deployment`
(with :mod:`kvlib.sizing.capacity` and, for a model split over ``tensor_parallel_size x
pipeline_parallel_size`` GPUs as vLLM splits it, :mod:`kvlib.sizing.parallel`; it is what the
tests check); :func:`calculator_report` takes the forms' values, within their :data:`LIMITS`;
:func:`calculator` wraps it in
ipywidgets for readers who run the notebook locally (ipywidgets is imported only then).
:func:`capacity_overview` is the static table shown beside the widget, and
:func:`kvlib.plotting.draw_max_batch` the static plot, so that readers of the online book see
the same numbers; there, :mod:`kvlib.sizing.web_calculator` gives them a calculator that runs
in the browser.
"""

from __future__ import annotations

import html
import math
from dataclasses import fields

from kvlib import KVLibError
from kvlib.checks import require_int, shown
from kvlib.sizing.capacity import max_batch, max_context, weight_bytes
from kvlib.sizing.catalog import catalog_entry, catalog_names
from kvlib.sizing.deployment import Deployment
from kvlib.sizing.dtypes import KV_DTYPES
from kvlib.sizing.parallel import kv_heads_per_gpu, per_gpu_bytes, pp_layer_ranges
from kvlib.sizing.spec import cache_bytes
from kvlib.units import GiB, ceil_div

# The calculators' bounds (this widget's and the online one's, kvlib/sizing/web_calculator.py): a value
# beyond one is refused with "... must be at most N here", never clamped. They keep every byte count
# below 2**53, where JavaScript numbers are exact integers (tests/sizing/test_web_calculator.py checks it).
LIMITS = {
    "batch": 100_000,
    "gpu_gib": 100_000,
    "overhead_gib": 100_000,
    "tensor_parallel_size": 1024,
    "pipeline_parallel_size": 1024,
}
_DEFAULTS = {f.name: f.default for f in fields(Deployment)}


def check_limits(fields: dict) -> None:
    """The form's bounds, checked first as the script checks them (each message names the field).

    ``fields`` are the form's values by :class:`~kvlib.sizing.deployment.Deployment`'s field names;
    a field left out is checked at its default.
    """
    for key, name in (("gpu_gib", "GPU memory"), ("overhead_gib", "overhead")):
        value = fields.get(key, _DEFAULTS[key])
        # an int is finite however large (math.isfinite cannot take one beyond a float's range)
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or not (isinstance(value, int) or math.isfinite(value)):
            raise KVLibError(f"{name} must be a number of GiB, not {shown(value)}")
        if value > LIMITS[key]:
            raise KVLibError(f"{name} must be at most {LIMITS[key]:,} GiB here")
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = fields.get(key, _DEFAULTS[key])
        require_int(value, key, low=1)
        if value > LIMITS[key]:
            raise KVLibError(f"{key} must be at most {LIMITS[key]:,} here")


def calculator_report(**fields) -> dict:
    """What both calculators show for the form's ``fields`` (:class:`Deployment`'s names): the
    form's :data:`LIMITS` checked first, as the script checks them, then :func:`capacity_report`."""
    check_limits(fields)
    report = capacity_report(Deployment(**fields))
    if report["batch"] > LIMITS["batch"]:
        raise KVLibError(f"batch must be at most {LIMITS['batch']:,} here")
    return report


def capacity_report(deployment: Deployment) -> dict:
    """Cache size, share of the GPU, and what fits, for one catalog model on one GPU, or on each GPU
    of ``tensor_parallel_size x pipeline_parallel_size`` GPUs laid out as vLLM does (chapter 2).

    ``gpu_gib`` and ``overhead_gib`` are per GPU. Under TP/PP the weights are split evenly over the
    GPUs and the cache is the fullest GPU's (:func:`kvlib.sizing.parallel.per_gpu_bytes`); the
    share, the max batch and the max context are that GPU's. With one GPU the numbers are
    :func:`kvlib.sizing.capacity.max_batch` and :func:`~kvlib.sizing.capacity.max_context`'s.
    """
    if not isinstance(deployment, Deployment):
        raise KVLibError(f"deployment must be a kvlib.sizing.deployment.Deployment, not {deployment!r:.60}")
    d = deployment
    gpu, overhead = d.gpu_bytes, d.overhead_bytes
    entry = d.entry
    spec = entry.spec
    context, batch, kv_dtype = d.context, d.batch, d.kv_dtype
    weights = weight_bytes(entry.num_parameters, d.weight_dtype)
    cache = cache_bytes(spec, context, batch, kv_dtype)
    tp, pp = d.tensor_parallel_size, d.pipeline_parallel_size
    gpu_weights = ceil_div(weights, tp * pp)
    gpu_cache = per_gpu_bytes(spec, context, batch, kv_dtype, tp, pp)
    return {
        "model": entry.name,
        "kv_dtype": kv_dtype,
        "context": context,
        "batch": batch,
        "weights_gib": weights / GiB,
        "cache_gib": cache / GiB,
        "gpu_gib": d.gpu_gib,
        "gpu_fraction": (gpu_weights + overhead + gpu_cache) / gpu,
        "fits": gpu_weights + overhead + gpu_cache <= gpu,
        "max_batch": max_batch(spec, context, gpu, gpu_weights, overhead, kv_dtype, tp, pp),
        "max_context": max_context(spec, batch, gpu, gpu_weights, overhead, kv_dtype, None, tp, pp),
        "model_max_context": spec.max_context,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "num_gpus": d.num_gpus,
        "weight_bytes_per_gpu": gpu_weights,
        "per_gpu_bytes": gpu_cache,
        "kv_heads_per_gpu": kv_heads_per_gpu(spec, tp),
        "num_kv_heads": spec.num_kv_heads,
        "is_mla": spec.is_mla,
        "layers_per_gpu": max(stop - start for start, stop in pp_layer_ranges(spec.num_layers, pp)),
    }


def report_html(report: dict) -> str:
    """The calculator's answer as a small HTML table."""
    r = report
    verdict = "fits" if r["fits"] else "does NOT fit"
    rows = [
        (
            "KV cache",
            f"{r['cache_gib']:,.2f} GiB for {r['batch']} x {r['context']:,} tokens ({r['kv_dtype']})",
        ),
        ("weights", f"{r['weights_gib']:,.2f} GiB"),
        ("GPU use", f"{r['gpu_fraction']:.0%} of {r['gpu_gib']:g} GiB: {verdict}"),
        ("max batch", f"{r['max_batch']:,} sequences of {r['context']:,} tokens"),
        (
            "max context",
            f"{r['max_context']:,} tokens at batch {r['batch']} (model maximum {r['model_max_context']:,})",
        ),
    ]
    if r["num_gpus"] > 1:
        heads = "the MLA latent" if r["is_mla"] else f"{r['kv_heads_per_gpu']} KV heads"
        rows[1:1] = [
            (
                "per GPU",
                f"{r['per_gpu_bytes'] / GiB:,.2f} GiB of KV cache on the fullest of {r['num_gpus']} GPUs "
                f"(TP {r['tensor_parallel_size']} x PP {r['pipeline_parallel_size']}): "
                f"{heads} x {r['layers_per_gpu']} layers",
            )
        ]
    cells = "".join(f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def calculator(model: str = "Llama-3-8B", context: int = 8192, batch: int = 8, gpu_gib: float = 80.0):
    """An ipywidgets calculator (local Jupyter only; the online book shows the static table instead).

    The starting values are checked as :func:`calculator_report` checks them (a KVLibError, never a
    traitlets error), and the boxes have no bounds of their own: a value typed is never clamped or
    rounded to another one; a value kvlib refuses (beyond :data:`LIMITS` too) shows kvlib's one-line
    message instead of the answer, as the online calculator does.
    """
    calculator_report(model=model, context=context, batch=batch, gpu_gib=gpu_gib)  # bad values: kvlib's words
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=catalog_names(), value=catalog_entry(model).name, description="model"),
        "context": w.IntText(value=context, description="context"),
        "batch": w.IntText(value=batch, description="batch"),
        "kv_dtype": w.Dropdown(
            options=[d for d in KV_DTYPES if d != "fp32"], value="fp16", description="KV dtype"
        ),
        "gpu_gib": w.FloatText(value=gpu_gib, description="GPU GiB"),
        "weight_dtype": w.Dropdown(options=["bf16", "fp8", "int4"], value="bf16", description="weights"),
        "overhead_gib": w.FloatText(value=4.0, description="overhead GiB"),
        "tensor_parallel_size": w.IntText(value=1, description="TP size"),
        "pipeline_parallel_size": w.IntText(value=1, description="PP size"),
    }
    answer = w.HTML()

    def update(_=None):
        try:
            answer.value = report_html(calculator_report(**{k: c.value for k, c in controls.items()}))
        except KVLibError as error:
            answer.value = f"<b>{html.escape(str(error), quote=False)}</b>"

    for control in controls.values():
        control.observe(update, names="value")
    update()
    return w.VBox([*controls.values(), answer])


def capacity_overview(
    gpu_gib: float = 80.0, context: int = 8192, overhead_gib: float = 4.0, kv_dtypes=("fp16", "fp8", "int4")
) -> list[dict]:
    """The static table: every catalog model on one GPU, bf16 weights, at ``context`` (or its maximum)."""
    rows = []
    for name in catalog_names():
        ctx = min(context, catalog_entry(name).spec.max_context)
        row = {"model": name, "context": ctx}
        for dtype in kv_dtypes:
            r = capacity_report(Deployment(name, ctx, 1, dtype, gpu_gib, "bf16", overhead_gib))
            row["weights GiB"] = round(r["weights_gib"], 1)
            row[f"GiB/seq {dtype}"] = round(r["cache_gib"], 3)
            row[f"max batch {dtype}"] = r["max_batch"]
        rows.append(row)
    return rows
