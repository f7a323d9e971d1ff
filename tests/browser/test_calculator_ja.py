"""Chapter 2's online calculator with its Japanese labels (ja/book/02_cache_size.html), in headless Chromium.

On a page that says <html lang="ja">, kvlib/sizing/web/calculator.js shows the form's words, the rows'
labels and texts and its messages in Japanese (the glossary's terms); the numbers stay kvlib's. These
tests open the built English and Japanese chapter 2 pages side by side and check that the Japanese
one shows Japanese words and no English word left (identifiers, units and model names excepted),
that every number of every row equals the English page's for the same inputs (typed into both forms,
then the script's own function for the whole catalog under several layouts), that a refused input
shows a Japanese message with kvlib's numbers, and that the English page keeps kvlib's words exactly
(tests/browser/test_calculator.py compares its rows with kvlib's). As in every browser test, neither
page may log a console error or send a request away from localhost.
"""

from __future__ import annotations

import itertools
import re

import pytest

from kvlib import KVLibError
from kvlib.sizing import web_calculator
from kvlib.sizing.catalog import catalog_entry, catalog_names
from tests.browser.pagecheck import WAIT_MS, open_page
from tests.browser.test_calculator import CASES, ROWS, set_inputs

PAGE = "book/02_cache_size.html"
JA_PAGE = "ja/" + PAGE
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uff00-\uffef]")

# The words the calculator's form shows: its title (the <b> and the text after it) and each label's
# own text (not the control inside it).
FORM_WORDS = """root => {
  const title = root.querySelector('p > b');
  return [title.textContent, title.nextSibling.nodeValue,
          ...Array.from(root.querySelectorAll('form label')).map(l => l.firstChild.nodeValue)];
}"""

# Latin words a Japanese engineer writes as they are: units, acronyms, the names of the choices, and
# identifiers (vLLM's flags, kvlib's parameter names) that stay code in the Japanese edition too.
KEPT = {"B", "GiB", "GPU", "KV", "MLA", "Python", *web_calculator.KV_CHOICES, *web_calculator.WEIGHT_CHOICES}
KEPT |= set(catalog_names())
IDENTIFIER = re.compile(r"--[a-z][a-z-]*|[a-z]+(?:_[a-z]+)+")
NUMBER = re.compile(r"(?<![A-Za-z0-9_.\-])\d+(?:,\d{3})*(?:\.\d+)?(?![A-Za-z0-9_])")
EXPONENT = re.compile(r"\d(?:\.\d+)?e[-+]?\d+")  # a float as Python's repr writes it: 1e-12

# more layouts than the English CASES: the two rows a TP x PP layout adds (per GPU, each GPU), MLA's
PARALLEL_CASES = [
    ("TP 16 beyond Llama-3-8B's 8 KV heads", dict(model="Llama-3-8B", tensor_parallel_size=16, gpu_gib=24.0)),
    (
        "MLA latent over TP 8 x PP 4",
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
        "cross-attention over TP 4 x PP 3",
        dict(
            model="Whisper-large-v3", context=448, batch=64, tensor_parallel_size=4, pipeline_parallel_size=3
        ),
    ),
]


def english_left(text: str) -> list[str]:
    """The Latin words of ``text`` that a Japanese reader should not see (what KEPT and IDENTIFIER allow
    removed first; a lone "x" for "times" counts as English)."""
    rest = IDENTIFIER.sub(" ", EXPONENT.sub(" ", text))
    words = re.findall(r"[A-Za-z][A-Za-z0-9.\-]*[A-Za-z0-9]|[A-Za-z]", rest)
    return [w for w in words if w not in KEPT]


def numbers(text: str) -> list[str]:
    """The numbers of a text in order, as written (1,073,741,824 and 1.000; not the 16 of bf16)."""
    return NUMBER.findall(text)


def says_numbers_of(japanese: str, english: str) -> bool:
    """Every number of kvlib's English message is in the Japanese one, in the same order (the Japanese
    may add one, as in 1バイト for "one byte")."""
    rest = iter(numbers(japanese))
    return all(n in rest for n in numbers(english))


def open_calculator(browser, book_url, html_dir, path):
    if not (html_dir / path).is_file():
        pytest.fail(f"the build has no {path}", pytrace=False)
    problems: list[str] = []
    page = open_page(browser, book_url + path, problems)
    assert page.locator(".kvcalc").count() == 1, f"{path} should show one online calculator"
    page.wait_for_selector('.kvcalc[data-ready="true"]', state="attached", timeout=WAIT_MS)
    page.set_default_timeout(WAIT_MS)
    return page, page.locator(".kvcalc"), problems


@pytest.fixture(scope="module")
def both(browser, book_url, html_dir):
    """The English and the Japanese chapter 2 pages: (page, calculator root, problems) for each."""
    en = open_calculator(browser, book_url, html_dir, PAGE)
    ja = open_calculator(browser, book_url, html_dir, JA_PAGE)
    yield en, ja
    en[0].close()
    ja[0].close()


def test_the_pages_run_this_trees_calculator(html_dir):
    """Chapter 2 stores the calculator (script included) as an executed output: after a change of
    calculator.js the notebook must be executed again, or the pages keep the old script."""
    script = web_calculator.script_source()
    stale = [p for p in (PAGE, JA_PAGE) if script not in (html_dir / p).read_text(encoding="utf-8")]
    assert stale == [], (
        f"{stale} embed an older kvlib/sizing/web/calculator.js than this tree's: execute "
        "book/02_cache_size.ipynb again (python -m tests.nbtools execute) and rebuild (make build-check)"
    )


def test_the_japanese_form_is_labelled_in_japanese(both, screenshots):
    (_, en_root, en_problems), (page, root, problems) = both
    assert page.evaluate("document.documentElement.lang") == "ja"
    english, japanese = en_root.evaluate(FORM_WORDS), root.evaluate(FORM_WORDS)
    assert len(japanese) == len(english) == 11  # title, its note, nine fields
    untranslated = [(e, j) for e, j in zip(english, japanese, strict=True) if not CJK.search(j)]
    assert untranslated == [], f"form words left in English: {untranslated}"
    left = {j: english_left(j) for j in japanese if english_left(j)}
    assert left == {}, f"English words in the Japanese form: {left}"
    # vLLM's flags stay as they are written on the command line
    assert [w.split("（")[0] for w in japanese[-2:]] == ["--tensor-parallel-size", "--pipeline-parallel-size"]
    root.screenshot(path=str(screenshots / "calculator-ja.png"))
    assert problems == en_problems == []


def test_the_english_form_keeps_kvlibs_words(both):
    """The English page shows the words calculator_html wrote, unchanged."""
    (page, root, problems), _ = both
    assert page.evaluate("document.documentElement.lang") == "en"
    fragment = web_calculator.calculator_html()
    title = re.search(r"<p><b>(.*?)</b>(.*?)</p>", fragment)
    labels = re.findall(r"<label>([^<]*)<", fragment)
    assert root.evaluate(FORM_WORDS) == [title.group(1), title.group(2), *labels]
    assert problems == []


@pytest.mark.parametrize(
    "why, inputs",
    [("defaults", {}), *CASES, *PARALLEL_CASES],
    ids=["defaults", *(c[0] for c in CASES), *(c[0] for c in PARALLEL_CASES)],
)
def test_japanese_rows_show_the_english_pages_numbers(both, why, inputs):
    """The same inputs typed into both pages: the English rows are kvlib's; the Japanese rows have the
    same keys, Japanese labels and texts, and every number of every row equal to the English one's."""
    (_, en_root, en_problems), (_, root, problems) = both
    values = {**web_calculator.DEFAULTS, **inputs}
    set_inputs(en_root, values)
    set_inputs(root, values)
    english, japanese = en_root.evaluate(ROWS), root.evaluate(ROWS)
    assert english == [list(r) for r in web_calculator.answer_rows(**values)], why
    assert [k for k, _, _ in japanese] == [k for k, _, _ in english], why
    for (key, _, en_text), (_, label, text) in zip(english, japanese, strict=True):
        assert CJK.search(label) and english_left(label) == [], f"{why}: {key} labelled {label!r}"
        worded = bool(english_left(en_text))  # the weights row on one GPU has no word to translate
        assert bool(CJK.search(text)) == worded and english_left(text) == [], f"{why}: {key} says {text!r}"
        assert numbers(text) == numbers(en_text), f"{why}: {key}: {text!r} against {en_text!r}"
        # a row that starts with its number does so in Japanese too (test_japanese reads the first one)
        if key != "kv_heads_per_gpu":  # "1 of the 8 KV heads": 各層のKVヘッド1個（全8個中）
            assert (NUMBER.match(text) is None) == (NUMBER.match(en_text) is None), f"{why}: {key}: {text!r}"
    assert root.locator(".kvcalc-error").text_content() == ""
    assert problems == en_problems == []


# (inputs kvlib refuses, the Japanese message the calculator shows for them)
BAD_INPUTS = [
    (dict(context=9000), "文脈長9,000は Llama-3-8B の最大8,192トークンを超えています"),
    (dict(batch=0), "バッチサイズは1以上の整数で指定してください（入力: 0）"),
    (dict(batch=100_001), "バッチサイズはここでは100,000以下にしてください"),
    (
        dict(gpu_gib=0.0),
        "GPUメモリは正の値、オーバーヘッドは負でない値にしてください（入力: 0.0 GiBと4.0 GiB）",
    ),
    (dict(gpu_gib=1e-12), "GPUメモリが1バイトに届きません（入力: 1e-12 GiB）"),
    (dict(overhead_gib=200_000.0), "オーバーヘッドはここでは100,000 GiB以下にしてください"),
    (
        dict(tensor_parallel_size=3),
        "アテンションヘッドの総数（32）はテンソル並列数（3）で割り切れる必要があります",
    ),
    (
        dict(model="Qwen2.5-7B", tensor_parallel_size=14),
        "KVヘッド数（4）はテンソル並列数（14）の約数か倍数である必要があります",
    ),
    (
        dict(pipeline_parallel_size=33),
        "pipeline_parallel_size（33）が Llama-3-8B の層数32を超えています: 層を持たないステージができます",
    ),
    (dict(pipeline_parallel_size=2000), "pipeline_parallel_size はここでは1,024以下にしてください"),
]


@pytest.mark.parametrize(
    "inputs, message",
    BAD_INPUTS,
    ids=[
        "context beyond the model",
        "batch 0",
        "batch over the limit",
        "no GPU memory",
        "under one byte",
        "overhead over the limit",
        "heads",
        "KV heads",
        "stages",
        "stages over the limit",
    ],
)
def test_a_bad_input_shows_the_message_in_japanese(both, inputs, message):
    """kvlib's English message on the English page, its Japanese on the Japanese page (the same numbers);
    the answer is hidden until a good input brings it back."""
    (_, en_root, en_problems), (_, root, problems) = both
    values = {**web_calculator.DEFAULTS, **inputs}
    with pytest.raises(KVLibError) as error:
        web_calculator.answer_rows(**values)
    for calculator in (en_root, root):
        set_inputs(calculator, values)
    assert en_root.locator(".kvcalc-error").text_content() == str(error.value)
    shown = root.locator(".kvcalc-error").text_content()
    assert shown == message
    assert says_numbers_of(shown, str(error.value)) and english_left(shown) == [], shown
    assert root.locator(".kvcalc-answer").is_hidden()
    set_inputs(root, web_calculator.DEFAULTS)
    assert root.locator(".kvcalc-error").text_content() == "" and root.locator(".kvcalc-answer").is_visible()
    set_inputs(en_root, web_calculator.DEFAULTS)
    assert problems == en_problems == []


def test_an_empty_field_is_named_in_japanese(both):
    _, (_, root, problems) = both
    set_inputs(root, {"batch": ""})
    assert (
        root.locator(".kvcalc-error").text_content()
        == "バッチサイズは1以上の整数で指定してください（入力: 空欄）"
    )
    set_inputs(root, {"gpu_gib": "", "batch": "8"})
    assert (
        root.locator(".kvcalc-error").text_content()
        == "GPUメモリはGiB単位の数値で指定してください（入力: 空欄）"
    )
    set_inputs(root, web_calculator.DEFAULTS)
    assert root.locator(".kvcalc-error").text_content() == ""
    assert problems == []


def test_every_catalog_model_and_layout_has_the_same_numbers_in_japanese(both):
    """The script's own function on the Japanese page, in English and in Japanese, for the whole
    catalog x dtypes x layouts: the same rows and numbers, or the same refusal in both words."""
    _, (page, root, problems) = both
    cases = []
    for model, kv, (tp, pp) in itertools.product(
        catalog_names(), web_calculator.KV_CHOICES, ((1, 1), (2, 1), (3, 5), (8, 2), (16, 33))
    ):
        longest = catalog_entry(model).spec.max_context
        for context, batch in ((1, 1), (min(4097, longest), 7), (longest, 1000)):
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
    answers = root.evaluate(
        """(root, cases) => cases.map(c => ['en', 'ja'].map(language => {
        try { return root.kvcalcRows(c, language); }
        catch (e) { return 'error: ' + (language === 'ja' ? e.ja : e.message); } }))""",
        [{k: str(v) for k, v in c.items()} for c in cases],
    )
    wrong, refused = [], 0
    for case, (english, japanese) in zip(cases, answers, strict=True):
        if isinstance(english, str):
            refused += 1
            ok = isinstance(japanese, str) and CJK.search(japanese) and says_numbers_of(japanese, english)
        else:
            ok = not isinstance(japanese, str) and [(k, numbers(t)) for k, _, t in japanese] == [
                (k, numbers(t)) for k, _, t in english
            ]
            ok = ok and all(
                CJK.search(label) and not english_left(label) and not english_left(text)
                for _, label, text in japanese
            )
        if not ok:
            wrong.append((case, english, japanese))
    assert wrong == [], f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]}"
    assert 0 < refused < len(cases) // 2
    assert problems == []
