"""The chapter 2 calculator: its numbers, its HTML, the widget, the static table; TP/PP per GPU and
wrong inputs."""

import math
import re

import pytest

from kvlib import KVLibError
from kvlib.sizing import widget as c
from kvlib.sizing.capacity import max_batch, max_context, weight_bytes
from kvlib.sizing.catalog import catalog_entry, catalog_names
from kvlib.sizing.deployment import Deployment
from kvlib.sizing.spec import cache_bytes
from kvlib.units import GiB


def test_report_numbers():
    r = c.capacity_report(
        Deployment("Llama-3-8B", 8192, 8, "fp16", gpu_gib=80, weight_dtype="bf16", overhead_gib=4)
    )
    assert r["cache_gib"] == 8.0 and r["max_batch"] == 61 and r["fits"]
    assert r["gpu_fraction"] == pytest.approx((16_060_522_496 / 2**30 + 4 + 8) / 80)
    assert (
        c.capacity_report(Deployment("Llama-2-70B", 4096, 1, gpu_gib=80))["max_batch"] == 0
    )  # 138 GB of bf16 weights
    assert "does NOT fit" in c.report_html(c.capacity_report(Deployment("Llama-3-8B", 8192, 100)))


def test_bad_input_is_named():
    with pytest.raises(KVLibError, match="GPU memory must be positive"):
        c.capacity_report(Deployment("Llama-3-8B", 10, 1, gpu_gib=0))
    with pytest.raises(KVLibError, match="did you mean"):
        c.capacity_report(Deployment("Llama3-8B", 10, 1))


def test_widget_updates_and_reports_errors():
    box = c.calculator()
    context, answer = box.children[1], box.children[-1]
    assert "max batch" in answer.value
    context.value = 9000  # beyond Llama-3-8B's 8,192: the error replaces the table
    assert "exceeds Llama-3-8B's maximum" in answer.value


def test_static_overview_covers_the_catalog():
    rows = c.capacity_overview()
    assert len(rows) == 13 and all(r["context"] <= 8192 for r in rows)
    llama3 = next(r for r in rows if r["model"] == "Llama-3-8B")
    assert llama3["max batch fp16"] == 61 and llama3["max batch int4"] == 195


# ------------------------------------------------------------------ TP/PP and bad input

LLAMA3_WEIGHTS = 16_060_522_496  # 8,030,261,248 bf16 parameters x 2 bytes


def test_tensor_and_pipeline_parallel_report_the_fullest_gpu():
    r = c.capacity_report(Deployment("Llama-3-8B", 8192, 8, tensor_parallel_size=2, pipeline_parallel_size=2))
    # each GPU: a quarter of the weights; 16 of the 32 layers; 4 of the 8 KV heads
    assert r["weight_bytes_per_gpu"] == 16_060_522_496 // 4 == 4_015_130_624
    assert r["kv_heads_per_gpu"] == 4 and r["layers_per_gpu"] == 16 and r["num_gpus"] == 4
    one_sequence = 16 * 8192 * (2 * 4 * 128 * 2)  # layers x tokens x (K + V) x heads x head_dim x 2 B
    assert r["per_gpu_bytes"] == 8 * one_sequence == 2 * 2**30
    assert r["gpu_fraction"] == (4_015_130_624 + 4 * 2**30 + 2 * 2**30) / (80 * 2**30)
    assert r["max_batch"] == (80 * 2**30 - 4_015_130_624 - 4 * 2**30) // one_sequence == 289
    assert r["cache_gib"] == 8.0  # the whole batch's cache, as on one GPU
    assert "per GPU" in c.report_html(r) and "4 KV heads x 16 layers" in c.report_html(r)


def test_tp_beyond_the_kv_heads_and_mla_latent():
    r = c.capacity_report(Deployment("Llama-3-8B", 8192, 1, tensor_parallel_size=16))
    assert r["kv_heads_per_gpu"] == 1 and r["per_gpu_bytes"] == 32 * 8192 * (2 * 1 * 128 * 2)
    mla = c.capacity_report(Deployment("DeepSeek-V3", 4096, 1, "fp8", 141, "fp8", tensor_parallel_size=8))
    assert mla["per_gpu_bytes"] == 61 * 4096 * (512 + 64)  # the whole latent on every rank
    assert "the MLA latent x 61 layers" in c.report_html(mla)


def test_one_gpu_is_what_it_always_was():
    """tp = pp = 1: the numbers of kvlib.sizing.capacity (chapter 2's outputs unchanged)."""
    for name in catalog_names():
        entry = catalog_entry(name)
        spec, weights = entry.spec, weight_bytes(entry.num_parameters, "bf16")
        for context, batch in ((1, 1), (min(4097, spec.max_context), 7), (spec.max_context, 3)):
            r = c.capacity_report(Deployment(name, context, batch, "int4", 80, "bf16", 4))
            cache = cache_bytes(spec, context, batch, "int4")
            assert r["gpu_fraction"] == (weights + 4 * GiB + cache) / (80 * GiB)
            assert r["max_batch"] == max_batch(spec, context, 80 * GiB, weights, 4 * GiB, "int4")
            assert r["max_context"] == max_context(spec, batch, 80 * GiB, weights, 4 * GiB, "int4")
            assert r["per_gpu_bytes"] == cache


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(gpu_gib=math.inf), "GPU memory and overhead must be finite numbers of GiB, not inf and 4.0"),
        (dict(gpu_gib=math.nan), "must be finite numbers of GiB, not nan"),
        (dict(overhead_gib=math.inf), "must be finite numbers of GiB, not 80.0 and inf"),
        (dict(gpu_gib="80"), "must be finite numbers of GiB, not '80'"),
        (dict(gpu_gib=None), "must be finite numbers of GiB, not None"),
        (dict(gpu_gib=True), "must be finite numbers of GiB, not True"),
        (dict(gpu_gib=1e-12), "GPU memory must be at least one byte, not 1e-12 GiB"),  # was ZeroDivisionError
        (dict(gpu_gib=-1.0), "GPU memory must be positive and overhead non-negative"),
        (dict(model=None), "model must be a catalog name, not None"),
        (dict(tensor_parallel_size=3), "must be divisible by tensor parallel size (3)"),
        (dict(tensor_parallel_size=1.0), "tensor_parallel_size must be an integer >= 1"),
        (dict(pipeline_parallel_size=33), "exceeds the 32 layers of Llama-3-8B"),
    ],
)
def test_wrong_types_and_values_are_one_line_errors(kw, message):
    args = {"model": "Llama-3-8B", "context": 8192, "batch": 1, "gpu_gib": 80.0, **kw}
    with pytest.raises(KVLibError, match=re.escape(message)) as error:
        Deployment(**args)
    assert "\n" not in str(error.value)


def test_widget_has_tp_and_pp():
    box = c.calculator()
    controls = {control.description: control for control in box.children[:-1]}
    controls["TP size"].value = 4
    assert "fullest of 4 GPUs" in box.children[-1].value
    controls["TP size"].value = 3
    assert "must be divisible by tensor parallel size (3)" in box.children[-1].value
