"""Open every page of the built book in headless Chromium and check what a reader would see.

Per page (tests/browser/pagecheck.py): no console error or uncaught exception, no request leaves
localhost (the book serves its own MathJax and widget scripts, see kvbook_sphinx), no local file
answers with an error, math is typeset (every ``.math`` element holds MathJax output and no raw
``\\(``, ``\\[`` or ``$$`` is left in the prose), widgets render, every image loads, and every local
link (navigation, header buttons, body) resolves to a file that exists, anchor included. A
screenshot of each page is saved under test-artifacts/screenshots/. The pages are found in the
built HTML, so a new chapter is tested without editing this file.
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import HTML_DIR, built_pages
from tests.browser.pagecheck import LinkChecker, check_page, serve
from tests.toc import toc_files

PAGES = built_pages()


def test_the_build_has_pages_to_test(html_dir):
    assert PAGES, f"no HTML pages found under {html_dir}"


def test_every_toc_entry_was_built(html_dir):
    missing = [f for f in toc_files() if not (html_dir / f"{f}.html").is_file()]
    assert missing == [], f"the build has no page for these _toc.yml entries: {missing}"


@pytest.mark.parametrize("page_path", PAGES or [pytest.param(None, id="no-built-book")])
def test_page(page_path, html_dir, book_url, browser, links, screenshots):
    if page_path is None:
        pytest.fail(f"no built book at {HTML_DIR}: run `make build-check` first", pytrace=False)
    name = page_path.removesuffix(".html").replace("/", "__") + ".png"
    problems = check_page(browser, book_url, page_path, html_dir, links, screenshots / name)
    assert problems == [], f"{page_path}:\n  " + "\n  ".join(problems)


# ---- the checker itself must catch each problem (on a small hand-made site, no Sphinx needed)

PNG_1x1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c63f8cfc0f01f0005000201a2fd5e6a0000000049454e44ae426082"
)
GOOD = """<!DOCTYPE html><html><head><title>good</title></head><body><main>
<h1 id="top">Good</h1><p>Prices are $5 and $6.</p><img src="dot.png" alt="dot">
<a href="good.html#top">here</a> <a href="bad.html">bad</a> <a href="https://example.org/">away</a>
<pre>print("$$ and \\( in code are fine")</pre></main></body></html>"""
BAD = """<!DOCTYPE html><html><head><title>bad</title>
<script src="https://cdn.jsdelivr.net/npm/some-lib/lib.js"></script>
<script>console.error("boom"); throw new Error("uncaught!");</script></head><body><main>
<p>Raw display math $$x^2$$ and inline \\(y\\) left in the text.</p>
<span class="math">\\(z\\)</span>
<img src="missing.png" alt="missing"><a href="nowhere.html">gone</a> <a href="good.html#no-such-id">anchor</a>
</main></body></html>"""


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "good.html").write_text(GOOD)
    (site / "bad.html").write_text(BAD)
    (site / "dot.png").write_bytes(PNG_1x1)
    with serve(site) as url:
        yield site, url


def test_checker_accepts_a_good_page(broken_site, browser):
    site, url = broken_site
    assert check_page(browser, url, "good.html", site, LinkChecker()) == []


def test_checker_catches_each_problem(broken_site, browser):
    site, url = broken_site
    report = "\n".join(check_page(browser, url, "bad.html", site, LinkChecker()))
    for expected in [
        "request leaves localhost: https://cdn.jsdelivr.net/npm/some-lib/lib.js",
        "console error: boom",
        "uncaught exception: uncaught!",
        "raw \\( left in the text",
        "raw $$ left in the text",
        "the page has math but loads no MathJax",
        "math not typeset: " + repr("\\(z\\)"),
        "HTTP 404: " + url + "missing.png",
        "image does not load: " + url + "missing.png",
        "broken link: " + url + "nowhere.html -> HTTP 404",
        "broken link: " + url + "good.html#no-such-id -> no element with id 'no-such-id'",
    ]:
        assert expected in report, f"the checker missed {expected!r}; it reported:\n{report}"
