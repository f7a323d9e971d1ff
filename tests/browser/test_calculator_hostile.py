"""The online calculator (kvlib/sizing/web/calculator.js) fed hostile inputs, in headless Chromium.

The script's ``rows(input)`` (``root.kvcalcRows``) used to throw ``raw.trim is not a function`` for
a form value that is not a string, and ``Cannot convert undefined to a BigInt`` for a model named
``__proto__``, ``toString`` or ``constructor`` (an object's prototype answered for the name). Every
input must now give either rows or an ``Error`` with kvlib's one-line message, and agree with kvlib's
Python (:func:`kvlib.sizing.web_calculator.answer_rows`, which calls ``calculator_report``) on
answering or refusing. The Python value of a typed string is what Python's ``int()`` (integer
fields) or ``float()`` reads from it; a string neither reads stays a string (and is refused).
Like test_calculator_parallel.py, this serves the fragment this tree renders now.
"""

from __future__ import annotations

import pytest

from kvlib import KVLibError
from kvlib.sizing import web_calculator
from tests.browser.pagecheck import WAIT_MS, open_page, serve

INTEGER_FIELDS = ("context", "batch", "tensor_parallel_size", "pipeline_parallel_size")
GIB_FIELDS = ("gpu_gib", "overhead_gib")
CHOOSE = "choose a model, a KV dtype and a weight dtype from the lists"
MISSING = object()  # the field left out of the input (undefined in JavaScript)

HOSTILE_TEXT = ["1e400", "-0", " 8 ", "0x10", "NaN", "Infinity", "-Infinity", "", "  ", "+8", "8.0", "1e3"]
HOSTILE_TEXT += ["-3", "0", "\n16\n", "1" + "0" * 30, "1" + "0" * 400, "0b11", "1_000", "8 8", "\u0668"]
CASES = (
    [(field, raw) for field in INTEGER_FIELDS + GIB_FIELDS for raw in HOSTILE_TEXT]
    + [("gpu_gib", raw) for raw in (".5", "24.", "1e-300", "5e-324", "1e5", "100000.0000001", "-1")]
    + [(field, value) for field in INTEGER_FIELDS for value in (8, 8.5, -0.0, 2**53 + 1, True, None, [8], {})]
    + [(field, value) for field in GIB_FIELDS for value in (24, 0.5, -0.0, True, None, [8], {"a": 1})]
    + [(field, MISSING) for field in INTEGER_FIELDS + GIB_FIELDS + ("model", "kv_dtype", "weight_dtype")]
    + [
        (field, name)
        for field in ("model", "kv_dtype", "weight_dtype")
        for name in ("__proto__", "toString", "constructor", "hasOwnProperty", "valueOf", "", 8, None)
    ]
    + [("kv_dtype", "fp32"), ("weight_dtype", "fp16"), ("model", "Llama-3-8B ")]
)


def python_value(field: str, raw):
    """What kvlib's Python gets for a form value: int()/float() of a string where they read it.

    Python's int() also reads "1_000" and digits of other scripts ("\u0668" is 8), which a number
    field never yields; the script refuses them, so they stay strings here (and kvlib refuses them).
    """
    if not isinstance(raw, str) or field not in INTEGER_FIELDS + GIB_FIELDS:
        return raw
    if "_" in raw or not raw.isascii():
        return raw
    for read in (int, float) if field in INTEGER_FIELDS else (float,):
        try:
            return read(raw)
        except ValueError:
            pass
    return raw


def python_answer(field: str, raw):
    """kvlib's rows for the input, or ``"error: <its message>"``."""
    inputs = dict(web_calculator.DEFAULTS)
    if raw is MISSING:
        inputs.pop(field)
        inputs.setdefault(
            field, None if field not in ("tensor_parallel_size", "pipeline_parallel_size") else 1
        )
    else:
        inputs[field] = python_value(field, raw)
    try:
        return [list(row) for row in web_calculator.answer_rows(**inputs)]
    except KVLibError as error:
        return f"error: {error}"


def same_refusal(python: str, script: str) -> bool:
    """Do kvlib's message and the script's say the same? Equal, or equal but for how the value is
    quoted (kvlib writes the Python value, inf or nan, the script what was typed, 1e400 or NaN);
    the script's one message for a name not in its lists stands for kvlib's "unknown model ..."
    and "... must be a catalog name"; and a batch beyond the form's bound is "at most 100,000 here"
    in the script while kvlib's calculator_report checks its bound on counts first."""
    if python == script:
        return True
    if ", not " in python and ", not " in script:
        return python.split(", not ")[0] == script.split(", not ")[0]
    if script == CHOOSE:
        return python.startswith(("unknown ", "model must be", "kv_dtype", "weight_dtype"))
    return script == "batch must be at most 100,000 here" and python.startswith("batch must be at most")


@pytest.fixture(scope="module")
def fresh(browser, tmp_path_factory):
    """This tree's calculator fragment on a page of its own: the page, its root, its problems."""
    folder = tmp_path_factory.mktemp("calculator-hostile")
    (folder / "index.html").write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>calculator</title></head>'
        f"<body>{web_calculator.calculator_html()}</body></html>",
        encoding="utf-8",
    )
    problems: list[str] = []
    with serve(folder) as url:
        page = open_page(browser, url + "index.html", problems)
        page.wait_for_selector('.kvcalc[data-ready="true"]', state="attached", timeout=WAIT_MS)
        page.set_default_timeout(WAIT_MS)
        yield page, page.locator(".kvcalc"), problems
        page.close()


# Each case: the defaults as the form's strings, one field replaced (or deleted) in JavaScript.
SCRIPT_CASES = """(root, [defaults, cases]) => cases.map(([field, missing, value]) => {
    const input = { ...defaults };
    if (missing) delete input[field]; else input[field] = value;
    try { return root.kvcalcRows(input); }
    catch (e) { return (e instanceof Error && e.name === "Error" ? "error: " : e.name + ": ") + e.message; }
})"""


def test_hostile_inputs_agree_with_kvlib(fresh):
    page, root, problems = fresh
    defaults = {k: str(v) for k, v in web_calculator.DEFAULTS.items()}
    shown = root.evaluate(
        SCRIPT_CASES,
        [defaults, [[field, raw is MISSING, None if raw is MISSING else raw] for field, raw in CASES]],
    )
    wrong = []
    for (field, raw), script in zip(CASES, shown, strict=True):
        python = python_answer(field, raw)
        if isinstance(python, list) or isinstance(script, list):
            agree = python == script
        else:
            agree = script.startswith("error: ") and same_refusal(python[7:], script[7:])
            agree = agree and "\n" not in script and len(script) < 300
        if not agree:
            wrong.append((field, raw if raw is not MISSING else "(missing)", python, script))
    assert wrong == [], f"{len(wrong)} of {len(CASES)} disagree:\n" + "\n".join(map(repr, wrong[:10]))
    answered = sum(isinstance(s, list) for s in shown)
    assert 0 < answered < len(CASES) // 2, answered  # most are refused, a few (" 8 ", "+8", 8, ...) answered
    assert problems == []


@pytest.mark.parametrize(
    "field, raw, answered",
    [("batch", " 8 ", 8), ("batch", "+8", 8), ("context", 4096, 4096), ("gpu_gib", " 24 ", 24.0)],
)
def test_what_python_reads_as_a_number_is_answered_as_that_number(fresh, field, raw, answered):
    page, root, problems = fresh
    defaults = {k: str(v) for k, v in web_calculator.DEFAULTS.items()}
    shown = root.evaluate(SCRIPT_CASES, [defaults, [[field, False, raw]]])[0]
    assert shown == [
        list(r) for r in web_calculator.answer_rows(**{**web_calculator.DEFAULTS, field: answered})
    ]
    assert problems == []


@pytest.mark.parametrize(
    "field, raw, message",
    [
        ("model", "__proto__", CHOOSE),
        ("model", "toString", CHOOSE),
        ("model", "constructor", CHOOSE),
        ("kv_dtype", "__proto__", CHOOSE),
        ("batch", "0x10", "batch must be an integer >= 1, not 0x10"),
        ("context", "1e400", "context must be an integer >= 1, not 1e400"),
        ("context", "-0", "context must be an integer >= 1, not 0"),
        ("batch", None, "batch must be an integer >= 1, not null"),
        ("batch", [8], "batch must be an integer >= 1, not an array"),
        ("gpu_gib", "Infinity", "GPU memory must be a number of GiB, not Infinity"),
        ("gpu_gib", "-0", "GPU memory must be positive and overhead non-negative, not -0.0 and 4.0 GiB"),
        ("overhead_gib", {}, "overhead must be a number of GiB, not an object"),
        (
            "context",
            "1" + "0" * 30,
            "context must be at most 1,000,000,000,000 (kvlib's bound on counts), not 1" + "0" * 30,
        ),
    ],
)
def test_refusals_name_the_field(fresh, field, raw, message):
    """The exact words for the cases the issue names (the old script threw a TypeError on each)."""
    page, root, problems = fresh
    defaults = {k: str(v) for k, v in web_calculator.DEFAULTS.items()}
    assert root.evaluate(SCRIPT_CASES, [defaults, [[field, False, raw]]]) == [f"error: {message}"]
    assert problems == []


@pytest.mark.parametrize("given", ["undefined", "null", "42", "'x'", "[]", "Object.create(null)"])
def test_an_input_that_is_not_an_object_is_a_message(fresh, given):
    page, root, problems = fresh
    shown = root.evaluate(
        f"""root => {{ try {{ return root.kvcalcRows({given}); }}
        catch (e) {{ return e.name + ": " + e.message; }} }}"""
    )
    assert shown == "Error: GPU memory must be a number of GiB, not empty"
    assert problems == []
