"""The Japanese edition (日本語版, _build/html/ja/, `make book-ja`) as a reader sees it in headless Chromium.

test_pages.py opens every page of both editions already (no console error, no request leaving
localhost, math typeset, widgets rendered, images and local links, the language links included,
a screenshot each). This file adds what belongs to the translated edition: it is complete (a
Japanese page for every English one, each saying lang="ja", each linked to its twin and back),
its Japanese text is drawn with real glyphs (no tofu: each character is compared with the box
Chromium draws for a character no font has), a click on the language link lands on the twin,
search finds Japanese words, and chapter 2's calculator computes kvlib's numbers on the ja page.
"""

from __future__ import annotations

import re
from urllib.parse import urljoin

import pytest

from kvlib import KVLibError
from kvlib.sizing import web_calculator
from tests.browser.conftest import built_pages
from tests.browser.pagecheck import WAIT_MS, open_page
from tests.browser.test_calculator import CASES, ROWS, first_number, kvlib_numbers, set_inputs
from tests.toc import toc_files

JA = "ja/"
PAGES = built_pages()
EN_PAGES = [p for p in PAGES if not p.startswith(JA)]
JA_PAGES = [p for p in PAGES if p.startswith(JA)]
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]")
# pages whose Japanese text is checked glyph by glyph (the theme's labels are Japanese on every ja page;
# the glossary also has the Japanese terms, on both editions)
GLYPH_PAGES = [
    "ja/book/intro.html",
    "ja/book/glossary.html",
    "ja/book/02_cache_size.html",
    "book/glossary.html",
]

# Draws each character on a canvas in the font of the element that holds it and compares the pixels
# with those of characters no font has (Chromium then draws the font's missing-glyph box, "tofu").
_GLYPHS = r"""async (extra) => {
  await document.fonts.ready;
  const cjk = /[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]/u;
  const families = new Map();  // character -> computed font-family of a visible element holding it
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, element = node.parentElement;
    if (!element || element.closest('script, style') || !element.getClientRects().length) continue;
    for (const ch of node.nodeValue)
      if (cjk.test(ch) && !families.has(ch)) families.set(ch, getComputedStyle(element).fontFamily);
  }
  const family = getComputedStyle(document.body).fontFamily;
  for (const ch of extra) families.set(ch, family);
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 40;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  const draw = (ch, font) => {
    ctx.clearRect(0, 0, 40, 40);
    ctx.font = font;
    ctx.textBaseline = 'top';
    ctx.fillText(ch, 4, 4);
    const alpha = ctx.getImageData(0, 0, 40, 40).data.filter((_, i) => i % 4 === 3);
    return {ink: alpha.some(a => a > 0), key: alpha.join(',')};
  };
  const missing = new Map();  // font -> pixels of a character that no font has
  const tofu = [];
  for (const [ch, fam] of families) {
    const font = `28px ${fam}`;
    if (!missing.has(font)) missing.set(font, draw('\u{10FFFD}', font).key);
    const glyph = draw(ch, font);
    if (!glyph.ink || glyph.key === missing.get(font)) tofu.push(ch);
  }
  return {checked: families.size - extra.length, tofu: tofu.join('')};
}"""


def _html_lang(source: str) -> str | None:
    match = re.search(r"<html[^>]*\blang=\"([^\"]+)\"", source)
    return match.group(1) if match else None


def test_every_page_has_its_japanese_twin(html_dir):
    assert JA_PAGES, f"no Japanese edition under {html_dir / 'ja'}: run `make build-check` or `make book`"
    missing = [f for f in toc_files() if not (html_dir / JA / f"{f}.html").is_file()]
    assert missing == [], f"the Japanese edition has no page for these _toc.yml entries: {missing}"
    assert sorted(p.removeprefix(JA) for p in JA_PAGES) == EN_PAGES


@pytest.mark.parametrize("page_path", [p for p in PAGES if p != "index.html" and p != "ja/index.html"])
def test_pages_say_their_language_and_link_their_twin(html_dir, page_path):
    """lang="ja" on the Japanese pages (lang="en" on the English ones), and a link to the same page in
    the other edition, as an <a> above the text and a <link rel="alternate" hreflang> in the head."""
    source = (html_dir / page_path).read_text(encoding="utf-8")
    japanese = page_path.startswith(JA)
    twin, other = (page_path.removeprefix(JA), "en") if japanese else (JA + page_path, "ja")
    assert _html_lang(source) == ("ja" if japanese else "en"), page_path
    base = "http://book/" + page_path
    anchors = re.findall(rf'<a class="kvbook-language" href="([^"]+)" hreflang="{other}"', source)
    alternates = re.findall(rf'<link rel="alternate" hreflang="{other}" href="([^"]+)"', source)
    assert [urljoin(base, a) for a in anchors] == ["http://book/" + twin], page_path
    assert [urljoin(base, a) for a in alternates] == ["http://book/" + twin], page_path


@pytest.mark.parametrize("page_path", GLYPH_PAGES)
def test_japanese_text_is_drawn_with_real_glyphs(page_path, html_dir, book_url, browser):
    if not (html_dir / page_path).is_file():
        pytest.fail(f"the build has no {page_path}", pytrace=False)
    problems: list[str] = []
    page = open_page(browser, book_url + page_path, problems)
    try:
        # U+0378 is unassigned: no font has it, so the check must call it tofu (the check works)
        result = page.evaluate(_GLYPHS, ["\u0378"])
    finally:
        page.close()
    assert result["checked"] > 0, f"{page_path}: no Japanese text found"
    assert "\u0378" in result["tofu"], "the glyph check did not see a missing glyph as one"
    tofu = result["tofu"].replace("\u0378", "")
    assert tofu == "", (
        f"{page_path}: {len(tofu)} of {result['checked']} Japanese characters have no glyph (tofu): {tofu}; "
        "install a Japanese font (Debian: apt-get install fonts-ipafont-gothic, as .ci/run does)"
    )
    assert problems == []


LINKED = "book/references.html"  # a short page: the click test waits for no MathJax or widgets


def test_the_language_links_lead_to_the_twin_and_back(book_url, browser):
    problems: list[str] = []
    page = open_page(browser, book_url + JA + LINKED, problems)
    try:
        page.locator('a.kvbook-language[hreflang="en"]').click()
        page.wait_for_url(book_url + LINKED, timeout=WAIT_MS)
        assert page.evaluate("document.documentElement.lang") == "en"
        page.locator('a.kvbook-language[hreflang="ja"]').click()
        page.wait_for_url(book_url + JA + LINKED, timeout=WAIT_MS)
        assert page.evaluate("document.documentElement.lang") == "ja"
    finally:
        page.close()
    assert problems == []


def test_search_finds_japanese_words(book_url, browser):
    """The Japanese edition's own search index (Sphinx's Japanese word splitter) finds a Japanese
    term (the glossary's KVキャッシュ) and links to pages of the Japanese edition."""
    problems: list[str] = []
    page = open_page(browser, book_url + "ja/search.html?q=キャッシュ", problems)
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('#search-results ul.search li').length > 0", timeout=WAIT_MS
        )
        hrefs = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")
    finally:
        page.close()
    assert any(h.startswith(book_url + "ja/book/glossary.html") for h in hrefs), hrefs
    assert all(h.startswith(book_url + JA) for h in hrefs), hrefs
    assert problems == []


@pytest.fixture(scope="module")
def calculator_ja(browser, book_url, html_dir):
    """Chapter 2's Japanese page, its calculator and the page's problems so far."""
    path = JA + "book/02_cache_size.html"
    if not (html_dir / path).is_file():
        pytest.fail(f"the build has no {path}", pytrace=False)
    problems: list[str] = []
    page = open_page(browser, book_url + path, problems)
    assert page.locator(".kvcalc").count() == 1, "the Japanese chapter 2 should show one online calculator"
    page.wait_for_selector('.kvcalc[data-ready="true"]', state="attached", timeout=WAIT_MS)
    yield page, page.locator(".kvcalc"), problems
    page.close()


def test_japanese_chapter_2_typesets_its_math(calculator_ja, html_dir):
    page, _, problems = calculator_ja
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
    page.evaluate("() => MathJax.startup.promise")
    english = (html_dir / "book/02_cache_size.html").read_text(encoding="utf-8").count('class="math')
    assert english > 0
    assert page.locator(".math mjx-container").count() == page.locator(".math").count() == english
    assert problems == []


# the default inputs, then one case per kind of model (MHA, GQA, windows, MLA, capacity)
JA_CASES = [("defaults", {})] + [CASES[i] for i in (0, 1, 2, 4, 7)]


@pytest.mark.parametrize("why, inputs", JA_CASES, ids=[c[0] for c in JA_CASES])
def test_the_calculator_computes_kvlibs_numbers_on_the_japanese_page(calculator_ja, why, inputs):
    """Rows and numbers as kvlib computes them (the labels are compared by their keys, not their words,
    so that the calculator may label its rows in Japanese)."""
    page, root, problems = calculator_ja
    values = {**web_calculator.DEFAULTS, **inputs}
    set_inputs(root, values)
    shown = root.evaluate(ROWS)
    assert [key for key, _, _ in shown] == [key for key, _, _ in web_calculator.answer_rows(**values)], why
    numbers = {key: first_number(text) for key, _, text in shown}
    assert numbers == kvlib_numbers(inputs), why
    assert root.locator(".kvcalc-error").text_content() == ""
    assert problems == []


def test_the_calculator_refuses_bad_inputs_on_the_japanese_page(calculator_ja):
    page, root, problems = calculator_ja
    values = {**web_calculator.DEFAULTS, "context": 9000}
    with pytest.raises(KVLibError):
        web_calculator.answer_rows(**values)
    set_inputs(root, values)
    assert root.locator(".kvcalc-error").text_content() != ""
    assert root.locator(".kvcalc-answer").is_hidden()
    set_inputs(root, web_calculator.DEFAULTS)
    assert root.locator(".kvcalc-error").text_content() == "" and root.locator(".kvcalc-answer").is_visible()
    assert problems == []
