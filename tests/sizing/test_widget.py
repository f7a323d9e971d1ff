"""The chapter 2 calculator: its numbers, its HTML, the widget, the static table."""

import pytest

from kvlib import KVLibError
from kvlib.sizing import widget as c


def test_report_numbers():
    r = c.capacity_report("Llama-3-8B", 8192, 8, "fp16", gpu_gib=80, weight_dtype="bf16", overhead_gib=4)
    assert r["cache_gib"] == 8.0 and r["max_batch"] == 61 and r["fits"]
    assert r["gpu_fraction"] == pytest.approx((16_060_522_496 / 2**30 + 4 + 8) / 80)
    assert c.capacity_report("Llama-2-70B", 4096, 1, gpu_gib=80)["max_batch"] == 0  # 138 GB of bf16 weights
    assert "does NOT fit" in c.report_html(c.capacity_report("Llama-3-8B", 8192, 100))


def test_bad_input_is_named():
    with pytest.raises(KVLibError, match="GPU memory must be positive"):
        c.capacity_report("Llama-3-8B", 10, 1, gpu_gib=0)
    with pytest.raises(KVLibError, match="did you mean"):
        c.capacity_report("Llama3-8B", 10, 1)


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
