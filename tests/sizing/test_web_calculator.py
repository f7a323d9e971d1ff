"""The online calculator (kvlib.sizing.web_calculator, kvlib/sizing/web/calculator.js) without a
browser: its embedded data, its self-containment, its Python answer, and the names the script reads
from the catalog export. tests/browser/test_calculator.py runs the script itself and compares it
with kvlib."""

import html
import json
import re

import pytest

from kvlib import KVLibError
from kvlib.sizing import web_calculator, widget
from kvlib.sizing.capacity import max_batch, weight_bytes
from kvlib.sizing.catalog import catalog_entry, catalog_export, catalog_names
from kvlib.sizing.spec import bytes_per_token, cache_bytes
from kvlib.units import GiB

PAGE = web_calculator.calculator_html()
SCRIPT = web_calculator.script_source()


def test_embedded_catalog_is_catalog_export():
    found = re.findall(r'<script type="application/json" class="kvcalc-data">(.*?)</script>', PAGE, re.S)
    assert len(found) == 1
    assert json.loads(found[0]) == json.loads(json.dumps(catalog_export()))


def test_fragment_is_self_contained():
    assert not re.search(r"https?:|//[\w.-]+\.\w", SCRIPT), "the script must not name any URL"
    assert not re.search(r"\b(fetch|XMLHttpRequest|import|require|eval|WebSocket)\b", SCRIPT)
    tags = re.findall(r"<script[^>]*>", PAGE)
    assert tags == ['<script type="application/json" class="kvcalc-data">', "<script>"]
    assert not re.search(r"\s(src|href)=", PAGE), "nothing in the fragment may load a file"
    assert (
        SCRIPT in PAGE and PAGE == web_calculator.calculator_html()
    )  # deterministic: nbval compares it exactly


def test_embedded_json_cannot_close_its_script():
    text = web_calculator.embedded_json({"note": "</script><script>alert(1)</script>"})
    assert "</" not in text and json.loads(text) == {"note": "</script><script>alert(1)</script>"}


def test_script_reads_only_fields_the_export_has():
    export = catalog_export()
    model_fields = set(re.findall(r"\bm\.(\w+)", SCRIPT))
    dtype_fields = set(re.findall(r"\b(?:dtype|weightDtype)\.(\w+)", SCRIPT))
    assert (
        {
            "sliding_windows",
            "vectors_per_token_per_layer",
            "values_per_vector",
            "cross_attention_tokens",
            "num_parameters",
            "max_context",
        }
        <= model_fields
        <= set(export["models"][0])
    )
    assert {"bits", "group_size", "meta_bytes", "name"} <= dtype_fields <= set(export["kv_dtypes"]["int4"])
    assert {"kv_dtypes", "models"} >= set(re.findall(r"\bcatalog\.(\w+)", SCRIPT))


def test_prefilled_answer_is_kvlibs():
    rows = re.findall(r'<tr data-out="(\w+)"><th>(.*?)</th><td>(.*?)</td></tr>', PAGE)
    assert [(k, label, html.unescape(text)) for k, label, text in rows] == web_calculator.answer_rows(
        **web_calculator.DEFAULTS
    )
    assert 'value="8192"' in PAGE and "<option selected>Llama-3-8B</option>" in PAGE


def _rows(**inputs):
    return dict((key, text) for key, _, text in web_calculator.answer_rows(**inputs))


def test_answer_numbers_are_kvlibs():
    llama2 = catalog_entry("Llama-2-7B").spec
    rows = _rows(model="Llama-2-7B", context=4096, batch=1)
    assert (
        rows["per_token"]
        == f"{bytes_per_token(llama2):,} B = 32 attention layers x 16,384 B"
        == "524,288 B = 32 attention layers x 16,384 B"
    )
    assert rows["per_sequence"] == "2,147,483,648 B (2.000 GiB) at 4,096 tokens"
    assert _rows(model="Llama-2-7B", context=128, batch=1)["per_sequence"].startswith(
        "67,108,864 B (0.062 GiB)"
    )
    rows = _rows(
        model="Llama-3-8B", context=8192, batch=8
    )  # tests/sizing/test_widget.py: 8 GiB, 61 sequences
    assert (
        rows["batch"]
        == f"{cache_bytes(catalog_entry('Llama-3-8B').spec, 8192, 8):,} B (8.000 GiB) for 8 sequences"
    )
    assert rows["max_batch"] == "61 sequences of 8,192 tokens"
    assert rows["gpu_share"] == f"{(16_060_522_496 + 12 * GiB) / (80 * GiB):.1%} used: fits"
    whisper = _rows(model="Whisper-large-v3", context=448, batch=1)
    assert whisper["per_sequence"].endswith(
        ", of which 245,760,000 B cross-attention"
    )  # 32 layers x 1,500 x 5,120 B
    mistral = catalog_entry("Mistral-7B-v0.1")
    rows = _rows(
        model="Mistral-7B-v0.1", context=32768, batch=1, kv_dtype="int4", gpu_gib=24, weight_dtype="int4"
    )
    weights = weight_bytes(mistral.num_parameters, "int4")
    per_sequence = cache_bytes(mistral.spec, 32768, 1, "int4")  # capped by the 4,096-token window
    assert per_sequence == cache_bytes(mistral.spec, 4096, 1, "int4")
    assert (
        rows["max_batch"]
        == f"{max_batch(mistral.spec, 32768, 24 * GiB, weights, 4 * GiB, 'int4'):,} sequences"
        " of 32,768 tokens"
    )


def test_limits_keep_every_byte_count_exact_in_javascript():
    largest = max(
        cache_bytes(
            catalog_entry(name).spec, catalog_entry(name).spec.max_context, web_calculator.LIMITS["batch"], kv
        )
        for name in catalog_names()
        for kv in web_calculator.KV_CHOICES
    )
    heaviest = max(
        weight_bytes(catalog_entry(name).num_parameters, w)
        for name in catalog_names()
        for w in web_calculator.WEIGHT_CHOICES
    )
    assert largest + heaviest + web_calculator.LIMITS["overhead_gib"] * GiB < 2**53
    assert web_calculator.LIMITS["gpu_gib"] * GiB < 2**53


def test_choices_and_defaults_match_the_widget():
    controls = {c.description: c for c in widget.calculator().children[:-1]}
    assert tuple(controls["KV dtype"].options) == web_calculator.KV_CHOICES
    assert tuple(controls["weights"].options) == web_calculator.WEIGHT_CHOICES
    assert list(controls["model"].options) == catalog_names()
    assert [controls[k].value for k in ("model", "context", "batch", "GPU GiB", "overhead GiB")] == [
        web_calculator.DEFAULTS[k] for k in ("model", "context", "batch", "gpu_gib", "overhead_gib")
    ]


@pytest.mark.parametrize(
    "inputs, message",
    [
        (dict(context=9000), "context 9,000 exceeds Llama-3-8B's maximum of 8,192 tokens"),
        (dict(batch=0), "batch must be an integer >= 1, not 0"),
        (dict(batch=100_001), "batch must be at most 100,000 here"),
        (dict(gpu_gib=0.0), "GPU memory must be positive and overhead non-negative, not 0.0 and 4.0 GiB"),
        (dict(overhead_gib=1e6), "overhead must be at most 100,000 GiB here"),
    ],
)
def test_bad_input_is_named(inputs, message):
    with pytest.raises(KVLibError, match=re.escape(message)):
        web_calculator.answer_rows(**{**web_calculator.DEFAULTS, **inputs})


def test_unknown_calculator_input_is_named():
    with pytest.raises(KVLibError, match="unknown calculator inputs: gpu"):
        web_calculator.calculator_html(gpu=80)


# ------------------------------------------------------------------ TP/PP and bad input


def test_form_has_vllms_parallel_flags_and_widget_bounds():
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        assert re.search(rf'name="{key}" min="1" max="{web_calculator.LIMITS[key]}" step="1" value="1"', PAGE)
    box = widget.calculator()
    controls, answer = {c.description: c for c in box.children[:-1]}, box.children[-1]
    for description, key in (("TP size", "tensor_parallel_size"), ("PP size", "pipeline_parallel_size")):
        controls[description].value = web_calculator.LIMITS[key] + 1  # refused as the form refuses it
        assert controls[description].value == web_calculator.LIMITS[key] + 1  # kept, not clamped
        assert f"{key} must be at most {web_calculator.LIMITS[key]:,} here" in answer.value
        controls[description].value = 1
    controls["batch"].value = web_calculator.LIMITS["batch"] + 1
    assert f"batch must be at most {web_calculator.LIMITS['batch']:,} here" in answer.value


def test_one_gpu_rows_are_unchanged():
    keys = [key for key, _, _ in web_calculator.answer_rows(**web_calculator.DEFAULTS)]
    assert keys == ["per_token", "per_sequence", "batch", "weights", "gpu_share", "max_batch", "max_context"]


def test_parallel_rows_by_hand():
    rows = _rows(model="Llama-3-8B", context=8192, batch=8, tensor_parallel_size=16, pipeline_parallel_size=3)
    # 32 layers on 3 stages: 11, 11, 10; 8 KV heads on 16 ranks: one replicated head per rank
    per_gpu = 8 * 11 * 8192 * (2 * 1 * 128 * 2)  # batch x layers x tokens x (K + V) x 1 head x 128 x 2 B
    assert per_gpu == 369_098_752
    assert rows["per_gpu"] == (
        "369,098,752 B (0.344 GiB) for 8 sequences on the fullest of 48 GPUs "
        "(tensor_parallel_size 16 x pipeline_parallel_size 3)"
    )
    assert rows["kv_heads_per_gpu"] == "1 of the 8 KV heads per layer x 11 layers"
    weights = -(-16_060_522_496 // 48)  # ceil: 334,594,219 B per GPU
    assert rows["weights"].endswith(f", {weights:,} B (0.312 GiB) per GPU")
    used = weights + 4 * GiB + per_gpu
    assert rows["gpu_share"] == f"{used / (80 * GiB):.1%} used on the fullest GPU: fits"
    free = 80 * GiB - weights - 4 * GiB
    assert rows["max_batch"] == f"{free // (per_gpu // 8):,} sequences of 8,192 tokens"
    mla = _rows(model="DeepSeek-V3", context=4096, batch=1, gpu_gib=141, tensor_parallel_size=8)
    assert mla["kv_heads_per_gpu"] == "the MLA latent (replicated on every GPU) x 61 layers"


@pytest.mark.parametrize(
    "inputs, message",
    [
        (dict(gpu_gib=float("inf")), "GPU memory must be a number of GiB, not inf"),
        (dict(gpu_gib=float("nan")), "GPU memory must be a number of GiB, not nan"),
        (dict(gpu_gib=1e-12), "GPU memory must be at least one byte, not 1e-12 GiB"),
        (dict(overhead_gib=float("-inf")), "overhead must be a number of GiB, not -inf"),
        (dict(tensor_parallel_size=1025), "tensor_parallel_size must be at most 1,024 here"),
        (dict(pipeline_parallel_size=0), "pipeline_parallel_size must be an integer >= 1, not 0"),
        (dict(tensor_parallel_size=3), "total number of attention heads (32) must be divisible by"),
    ],
)
def test_bad_parallel_and_memory_inputs_are_named(inputs, message):
    with pytest.raises(KVLibError, match=re.escape(message)):
        web_calculator.answer_rows(**{**web_calculator.DEFAULTS, **inputs})


def test_script_cannot_loop_on_an_infinite_share():
    """The tab froze when fixed() met Infinity (GPU memory under one byte): it now throws first."""
    assert "if (!Number.isFinite(x) || x < 0) throw" in SCRIPT
    assert "if (gpu < 1n) fail(" in SCRIPT  # fail() throws kvlib's message (and its Japanese)
    assert "function fail(" in SCRIPT and "    throw error;\n" in SCRIPT
