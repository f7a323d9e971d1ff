"""The online calculator of chapter 2 (kvlib/sizing/web/calculator.js) in headless Chromium, against kvlib.

The built chapter 2 page must carry the calculator. Inputs typed into its form must show exactly
the rows kvlib.sizing.web_calculator.answer_rows formats, and the numbers in them must be the ones
kvlib.sizing computes here in Python (for a few readers' cases: MHA, GQA, sliding windows, MLA,
cross-attention, int4, capacity); bad inputs must show kvlib's error message. The script's own
function is then fed every catalog model x KV dtype x weight dtype. Throughout, the page may log
no console error and send no request away from localhost (the checks of pagecheck.open_page).
"""

from __future__ import annotations

import itertools
import re

import pytest

from kvlib import KVLibError
from kvlib.sizing import web_calculator
from kvlib.sizing.capacity import max_batch, max_context, weight_bytes
from kvlib.sizing.catalog import catalog_entry, catalog_names
from kvlib.sizing.deployment import Deployment
from kvlib.sizing.spec import bytes_per_token, cache_bytes
from kvlib.sizing.widget import capacity_report
from kvlib.units import GiB
from tests.browser.pagecheck import WAIT_MS, open_page

PAGE = "book/02_cache_size.html"
ROWS = """root => Array.from(root.querySelectorAll('tr[data-out]'))
                  .map(tr => [tr.dataset.out, tr.cells[0].textContent, tr.cells[1].textContent])"""

# (what the case exercises, inputs that differ from web_calculator.DEFAULTS)
CASES = [
    ("MHA, the article's formula", dict(model="Llama-2-7B", context=4096, batch=1, kv_dtype="fp16")),
    ("GQA", dict(model="Llama-3-8B", context=8192, batch=8)),
    ("sliding window on every layer, past it", dict(model="Mistral-7B-v0.1", context=32768, batch=4)),
    (
        "windows on alternate layers, past them",
        dict(model="Gemma-2-9B", context=8192, batch=2, kv_dtype="bf16"),
    ),
    (
        "MLA on eight 141 GiB GPUs, fp8 weights",
        dict(
            model="DeepSeek-V3",
            context=65536,
            batch=16,
            kv_dtype="fp8",
            gpu_gib=1128.0,
            weight_dtype="fp8",
            overhead_gib=32.0,
        ),
    ),
    ("cross-attention", dict(model="Whisper-large-v3", context=448, batch=64, gpu_gib=24.0)),
    (
        "int4 cache and weights, scales included",
        dict(model="Llama-3-70B", context=8192, batch=4, kv_dtype="int4", weight_dtype="int4"),
    ),
    ("capacity: weights alone do not fit", dict(model="Llama-2-70B", context=4096, batch=1)),
    (
        "capacity: a 24 GiB GPU",
        dict(model="Qwen2.5-7B", context=32768, batch=2, kv_dtype="int8", gpu_gib=24.0, overhead_gib=2.5),
    ),
    ("hybrid: 4 attention layers of 32", dict(model="Jamba-v0.1", context=262144, batch=3, gpu_gib=141.0)),
    ("a halfway GiB value rounds to even", dict(model="Llama-2-7B", context=128, batch=1)),
]


@pytest.fixture(scope="module")
def calculator(browser, book_url, html_dir):
    """The chapter 2 page, its calculator's root element, and the list of page problems so far."""
    if not (html_dir / PAGE).is_file():
        pytest.fail(f"the build has no {PAGE}", pytrace=False)
    problems: list[str] = []
    page = open_page(browser, book_url + PAGE, problems)
    assert page.locator(".kvcalc").count() == 1, "chapter 2 should show one online calculator"
    page.wait_for_selector('.kvcalc[data-ready="true"]', state="attached", timeout=WAIT_MS)
    yield page, page.locator(".kvcalc"), problems
    page.close()


def set_inputs(root, inputs: dict) -> None:
    for name, value in inputs.items():
        field = root.locator(f'[name="{name}"]')
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(str(value))
        else:
            field.fill(str(value))


def first_number(text: str) -> float:
    return float(re.match(r"([\d,.]+)", text).group(1).replace(",", ""))


def kvlib_numbers(inputs: dict) -> dict:
    """The numbers of each row, computed here with kvlib.sizing (capacity, spec and widget)."""
    i = {**web_calculator.DEFAULTS, **inputs}
    entry = catalog_entry(i["model"])
    spec, kv, context, batch = entry.spec, i["kv_dtype"], i["context"], i["batch"]
    weights = weight_bytes(entry.num_parameters, i["weight_dtype"])
    gpu, overhead = int(i["gpu_gib"] * GiB), int(i["overhead_gib"] * GiB)
    report = capacity_report(
        Deployment(i["model"], context, batch, kv, i["gpu_gib"], i["weight_dtype"], i["overhead_gib"])
    )
    return {
        "per_token": bytes_per_token(spec, kv),
        "per_sequence": cache_bytes(spec, context, 1, kv),
        "batch": cache_bytes(spec, context, batch, kv),
        "weights": weights,
        "gpu_share": round(100 * report["gpu_fraction"], 1),
        "max_batch": max_batch(spec, context, gpu, weights, overhead, kv),
        "max_context": max_context(spec, batch, gpu, weights, overhead, kv),
    }


def test_script_answers_the_default_inputs_as_python_did(calculator):
    page, root, problems = calculator
    assert root.evaluate(ROWS) == [list(r) for r in web_calculator.answer_rows(**web_calculator.DEFAULTS)]
    assert problems == []


@pytest.mark.parametrize("why, inputs", CASES, ids=[c[0] for c in CASES])
def test_typed_inputs_show_kvlibs_numbers(calculator, screenshots, why, inputs):
    page, root, problems = calculator
    values = {**web_calculator.DEFAULTS, **inputs}
    set_inputs(root, values)
    shown = root.evaluate(ROWS)
    assert shown == [list(r) for r in web_calculator.answer_rows(**values)], why
    expected = kvlib_numbers(inputs)
    numbers = {key: first_number(text) for key, _, text in shown}
    assert numbers == expected, f"{why}: shown {numbers}, kvlib {expected}"
    assert root.locator(".kvcalc-error").text_content() == ""
    if why == CASES[0][0]:
        root.screenshot(path=str(screenshots / "calculator.png"))
    assert problems == []


@pytest.mark.parametrize(
    "inputs",
    [dict(context=9000), dict(batch=0), dict(gpu_gib=0.0), dict(batch=100_001)],
    ids=["context beyond the model", "batch 0", "no GPU memory", "batch over the limit"],
)
def test_bad_inputs_show_kvlibs_message(calculator, inputs):
    page, root, problems = calculator
    values = {**web_calculator.DEFAULTS, **inputs}
    with pytest.raises(KVLibError) as error:
        web_calculator.answer_rows(**values)
    set_inputs(root, values)
    assert root.locator(".kvcalc-error").text_content() == str(error.value)
    assert root.locator(".kvcalc-answer").is_hidden()
    set_inputs(root, web_calculator.DEFAULTS)  # a good input brings the answer back
    assert root.locator(".kvcalc-error").text_content() == "" and root.locator(".kvcalc-answer").is_visible()
    assert problems == []


def test_every_catalog_model_and_dtype_agrees(calculator):
    """The script's own function (what the form calls) for the whole catalog, at short, long and
    maximum contexts."""
    page, root, problems = calculator
    cases = []
    for model, kv, weights in itertools.product(
        catalog_names(), web_calculator.KV_CHOICES, web_calculator.WEIGHT_CHOICES
    ):
        longest = catalog_entry(model).spec.max_context
        for context, batch, gpu in (
            (1, 1, 80.0),
            (min(4097, longest), 7, 24.0),
            (longest, 100_000, 100_000.0),
        ):
            cases.append(
                {
                    **web_calculator.DEFAULTS,
                    "model": model,
                    "context": context,
                    "batch": batch,
                    "kv_dtype": kv,
                    "gpu_gib": gpu,
                    "weight_dtype": weights,
                }
            )
    shown = root.evaluate(
        """(root, cases) => cases.map(c => {
        try { return root.kvcalcRows(c); } catch (e) { return 'error: ' + e.message; } })""",
        [{k: str(v) for k, v in c.items()} for c in cases],
    )
    expected = [[list(r) for r in web_calculator.answer_rows(**c)] for c in cases]
    wrong = [(c, s, e) for c, s, e in zip(cases, shown, expected, strict=True) if s != e]
    assert wrong == [], f"{len(wrong)} of {len(cases)} disagree, first: {wrong[0]}"
    assert problems == []
