"""The online calculator under tensor and pipeline parallelism, in headless Chromium, against kvlib.

These tests serve the fragment kvlib.sizing.web_calculator.calculator_html() renders now (not the
one stored in the built chapter 2 page, which is as new as the notebook's last execution), so they
check the script this tree ships. Typed TP/PP inputs must show exactly kvlib's rows, and the per-GPU
numbers must be kvlib.sizing.parallel's; combinations vLLM rejects must show vLLM's reason; GPU
memory under one byte must show a message at once (it used to freeze the tab). As everywhere in
the browser tests, the page may log no console error and send no request away from localhost.
"""

from __future__ import annotations

import itertools
import re

import pytest

from kvlib import KVLibError
from kvlib.sizing import web_calculator
from kvlib.sizing.catalog import catalog_entry, catalog_names
from kvlib.sizing.parallel import kv_heads_per_gpu, per_gpu_bytes
from tests.browser.pagecheck import WAIT_MS, open_page, serve

ROWS = """root => Array.from(root.querySelectorAll('tr[data-out]'))
                  .map(tr => [tr.dataset.out, tr.cells[0].textContent, tr.cells[1].textContent])"""

# (what the case exercises, inputs that differ from web_calculator.DEFAULTS)
CASES = [
    (
        "TP 16 beyond Llama-3-8B's 8 KV heads: one replicated head per GPU",
        dict(model="Llama-3-8B", tensor_parallel_size=16, gpu_gib=24.0),
    ),
    ("PP 3 over 32 layers: stages of 11, 11, 10", dict(model="Llama-3-8B", pipeline_parallel_size=3)),
    (
        "MLA latent replicated over TP 8, PP 4 over 61 layers (15, 15, 16, 15)",
        dict(
            model="DeepSeek-V3",
            context=65536,
            batch=16,
            kv_dtype="fp8",
            gpu_gib=141.0,
            weight_dtype="fp8",
            tensor_parallel_size=8,
            pipeline_parallel_size=4,
        ),
    ),
    (
        "sliding windows on alternate layers, PP 5 over 42 layers",
        dict(model="Gemma-2-9B", tensor_parallel_size=2, pipeline_parallel_size=5, batch=3),
    ),
    (
        "cross-attention split over TP 4 x PP 3",
        dict(
            model="Whisper-large-v3", context=448, batch=64, tensor_parallel_size=4, pipeline_parallel_size=3
        ),
    ),
    (
        "hybrid: 4 attention layers of 32 on 4 stages",
        dict(model="Jamba-v0.1", context=262144, pipeline_parallel_size=4, gpu_gib=80.0),
    ),
    (
        "MQA: Falcon-7B's one KV head under TP 71",
        dict(model="Falcon-7B", context=2048, tensor_parallel_size=71),
    ),
]


@pytest.fixture(scope="module")
def fresh(browser, tmp_path_factory):
    """This tree's calculator fragment on a page of its own: the page, its root, its problems."""
    folder = tmp_path_factory.mktemp("calculator")
    (folder / "index.html").write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>calculator</title></head>'
        f"<body>{web_calculator.calculator_html()}</body></html>",
        encoding="utf-8",
    )
    problems: list[str] = []
    with serve(folder) as url:
        page = open_page(browser, url + "index.html", problems)
        page.wait_for_selector('.kvcalc[data-ready="true"]', state="attached", timeout=WAIT_MS)
        page.set_default_timeout(WAIT_MS)  # a frozen script would fail the test instead of hanging it
        yield page, page.locator(".kvcalc"), problems
        page.close()


def set_inputs(root, inputs: dict) -> None:
    for name, value in inputs.items():
        field = root.locator(f'[name="{name}"]')
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(str(value))
        else:
            field.fill(str(value))


def first_number(text: str) -> int:
    return int(re.match(r"([\d,]+)", text).group(1).replace(",", ""))


def test_default_answer_has_no_parallel_rows(fresh):
    page, root, problems = fresh
    shown = root.evaluate(ROWS)
    assert shown == [list(r) for r in web_calculator.answer_rows(**web_calculator.DEFAULTS)]
    assert "per_gpu" not in {key for key, _, _ in shown}
    assert problems == []


@pytest.mark.parametrize("why, inputs", CASES, ids=[c[0] for c in CASES])
def test_typed_tp_pp_inputs_show_kvlibs_per_gpu_numbers(fresh, why, inputs):
    page, root, problems = fresh
    values = {**web_calculator.DEFAULTS, **inputs}
    set_inputs(root, values)
    shown = root.evaluate(ROWS)
    assert shown == [list(r) for r in web_calculator.answer_rows(**values)], why
    rows = {key: text for key, _, text in shown}
    spec = catalog_entry(values["model"]).spec
    tp, pp = values["tensor_parallel_size"], values["pipeline_parallel_size"]
    assert first_number(rows["per_gpu"]) == per_gpu_bytes(
        spec, values["context"], values["batch"], values["kv_dtype"], tp, pp
    )
    heads = "the MLA latent" if spec.is_mla else f"{kv_heads_per_gpu(spec, tp)} of the {spec.num_kv_heads}"
    assert rows["kv_heads_per_gpu"].startswith(heads)
    assert root.locator(".kvcalc-error").text_content() == ""
    assert problems == []


@pytest.mark.parametrize(
    "inputs, reason",
    [
        (dict(tensor_parallel_size=3), "total number of attention heads (32) must be divisible"),
        (dict(model="Qwen2.5-7B", context=8192, tensor_parallel_size=14), "the number of KV heads (4)"),
        (dict(pipeline_parallel_size=33), "exceeds the 32 layers of Llama-3-8B"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1, not 0"),
        (dict(pipeline_parallel_size=2000), "pipeline_parallel_size must be at most 1,024 here"),
    ],
    ids=["heads", "KV heads", "stages", "zero", "limit"],
)
def test_combinations_vllm_rejects_show_its_reason(fresh, inputs, reason):
    page, root, problems = fresh
    values = {**web_calculator.DEFAULTS, **inputs}
    with pytest.raises(KVLibError, match=re.escape(reason)) as error:
        web_calculator.answer_rows(**values)
    set_inputs(root, values)
    assert root.locator(".kvcalc-error").text_content() == str(error.value)
    assert root.locator(".kvcalc-answer").is_hidden()
    set_inputs(root, web_calculator.DEFAULTS)
    assert root.locator(".kvcalc-error").text_content() == "" and root.locator(".kvcalc-answer").is_visible()
    assert problems == []


@pytest.mark.parametrize("gpu_gib", ["1e-12", "0.0000000001", "5e-324"])
def test_gpu_memory_under_one_byte_is_a_message_not_a_frozen_tab(fresh, gpu_gib):
    page, root, problems = fresh
    with pytest.raises(KVLibError) as error:
        web_calculator.answer_rows(**{**web_calculator.DEFAULTS, "gpu_gib": float(gpu_gib)})
    assert "at least one byte" in str(error.value)
    set_inputs(root, {**web_calculator.DEFAULTS, "gpu_gib": gpu_gib})  # times out (fails) if the tab hangs
    assert root.locator(".kvcalc-error").text_content() == str(error.value)
    set_inputs(root, web_calculator.DEFAULTS)
    assert root.locator(".kvcalc-error").text_content() == ""
    assert problems == []


def test_every_catalog_model_under_several_layouts_agrees(fresh):
    """The script's own function for the whole catalog x TP x PP (errors compared as messages)."""
    page, root, problems = fresh
    cases = []
    for model, tp, pp in itertools.product(catalog_names(), (1, 2, 3, 8, 16, 71), (1, 2, 5, 7, 33)):
        longest = catalog_entry(model).spec.max_context
        for context, batch, kv in ((1, 1, "fp16"), (min(4097, longest), 7, "int4"), (longest, 1000, "fp8")):
            cases.append(
                {
                    **web_calculator.DEFAULTS,
                    "model": model,
                    "context": context,
                    "batch": batch,
                    "kv_dtype": kv,
                    "tensor_parallel_size": tp,
                    "pipeline_parallel_size": pp,
                }
            )
    shown = root.evaluate(
        """(root, cases) => cases.map(c => {
        try { return root.kvcalcRows(c); } catch (e) { return 'error: ' + e.message; } })""",
        [{k: str(v) for k, v in c.items()} for c in cases],
    )

    def expected(case):
        try:
            return [list(r) for r in web_calculator.answer_rows(**case)]
        except KVLibError as error:
            return f"error: {error}"

    wrong = [(c, s, e) for c, s, e in zip(cases, shown, map(expected, cases), strict=True) if s != e]
    assert wrong == [], f"{len(wrong)} of {len(cases)} disagree, first: {wrong[0]}"
    assert sum(isinstance(s, list) for s in shown) > len(cases) // 3  # most layouts are accepted
    assert problems == []
