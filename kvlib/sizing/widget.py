"""The notebook's KV-cache calculator: chapter 2's sizing for any catalog model, GPU and KV dtype.

:func:`capacity_report` does the arithmetic (with :mod:`kvlib.sizing.capacity`; it is what
the tests check); :func:`calculator` wraps it in ipywidgets for readers who run the notebook
locally (ipywidgets is imported only then). :func:`capacity_overview` is the static table
shown beside the widget, and :func:`kvlib.plotting.draw_max_batch` the static plot, so that
readers of the online book see the same numbers; there, :mod:`kvlib.sizing.web_calculator`
gives them a calculator that runs in the browser.
"""

from __future__ import annotations

from kvlib import KVLibError
from kvlib.sizing.capacity import max_batch, max_context, weight_bytes
from kvlib.sizing.catalog import catalog_entry, catalog_names
from kvlib.sizing.dtypes import KV_DTYPES
from kvlib.sizing.spec import cache_bytes
from kvlib.units import GiB


def capacity_report(
    model: str,
    context: int,
    batch: int,
    kv_dtype: str = "fp16",
    gpu_gib: float = 80.0,
    weight_dtype: str = "bf16",
    overhead_gib: float = 4.0,
) -> dict:
    """Cache size, share of the GPU, and what fits, for one catalog model on one GPU."""
    if not gpu_gib > 0 or overhead_gib < 0:
        raise KVLibError(
            f"GPU memory must be positive and overhead non-negative, not {gpu_gib} and {overhead_gib} GiB"
        )
    entry = catalog_entry(model)
    spec, gpu, overhead = entry.spec, int(gpu_gib * GiB), int(overhead_gib * GiB)
    weights = weight_bytes(entry.num_parameters, weight_dtype)
    cache = cache_bytes(spec, context, batch, kv_dtype)
    return {
        "model": entry.name,
        "kv_dtype": kv_dtype,
        "context": context,
        "batch": batch,
        "weights_gib": weights / GiB,
        "cache_gib": cache / GiB,
        "gpu_gib": gpu_gib,
        "gpu_fraction": (weights + overhead + cache) / gpu,
        "fits": weights + overhead + cache <= gpu,
        "max_batch": max_batch(spec, context, gpu, weights, overhead, kv_dtype),
        "max_context": max_context(spec, batch, gpu, weights, overhead, kv_dtype),
        "model_max_context": spec.max_context,
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
    cells = "".join(f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def calculator(model: str = "Llama-3-8B", context: int = 8192, batch: int = 8, gpu_gib: float = 80.0):
    """An ipywidgets calculator (local Jupyter only; the online book shows the static table instead)."""
    import ipywidgets as w

    controls = {
        "model": w.Dropdown(options=catalog_names(), value=model, description="model"),
        "context": w.BoundedIntText(value=context, min=1, max=10_000_000, description="context"),
        "batch": w.BoundedIntText(value=batch, min=1, max=100_000, description="batch"),
        "kv_dtype": w.Dropdown(
            options=[d for d in KV_DTYPES if d != "fp32"], value="fp16", description="KV dtype"
        ),
        "gpu_gib": w.BoundedFloatText(value=gpu_gib, min=1, max=100_000, description="GPU GiB"),
        "weight_dtype": w.Dropdown(options=["bf16", "fp8", "int4"], value="bf16", description="weights"),
        "overhead_gib": w.BoundedFloatText(value=4.0, min=0, max=100_000, description="overhead GiB"),
    }
    answer = w.HTML()

    def update(_=None):
        try:
            answer.value = report_html(capacity_report(**{k: c.value for k, c in controls.items()}))
        except KVLibError as error:
            answer.value = f"<b>{error}</b>"

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
            r = capacity_report(name, ctx, 1, dtype, gpu_gib, "bf16", overhead_gib)
            row["weights GiB"] = round(r["weights_gib"], 1)
            row[f"GiB/seq {dtype}"] = round(r["cache_gib"], 3)
            row[f"max batch {dtype}"] = r["max_batch"]
        rows.append(row)
    return rows
