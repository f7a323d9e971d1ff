"""Check one page of a served book in a headless Chromium page and list what a reader would see wrong.

``check_page`` is used by test_pages.py for every built page and by its self-test on a hand-made
broken site; other browser tests (the online calculator, say) can reuse ``open_page``.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlsplit

LOCAL_HOSTS = {"127.0.0.1", "localhost"}
WAIT_MS = 15_000  # generous: the 2-core CI machine is shared with notebook kernels
# The top of each page by default; whole pages take twice as long (KVBOOK_FULL_SCREENSHOTS=1).
FULL_SCREENSHOTS = os.environ.get("KVBOOK_FULL_SCREENSHOTS", "") not in ("", "0")

_MATH = r"""() => {
  const maths = Array.from(document.querySelectorAll('.math'));
  const untypeset = maths.filter(m => !m.querySelector('mjx-container'))
                         .map(m => m.textContent.trim().slice(0, 60));
  // each text node on its own (joining them would glue "$a$" and "$b$" into "$a$$b$"), code excluded
  const walker = document.createTreeWalker(
    document.querySelector('main') || document.body, NodeFilter.SHOW_TEXT,
    {acceptNode: n => n.parentElement.closest('pre, code, script, style, textarea, mjx-container')
                      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  const texts = [];
  while (walker.nextNode()) texts.push(walker.currentNode.nodeValue);
  const raw = ['\\(', '\\[', '$$'].filter(s => texts.some(t => t.includes(s)));
  return {untypeset, raw};
}"""

_IMAGES = """async () => {
  const images = Array.from(document.images);
  images.forEach(i => { i.loading = 'eager'; });
  await Promise.all(images.map(i => i.complete ? null : new Promise(done => {
    i.addEventListener('load', done); i.addEventListener('error', done); setTimeout(done, 10000);
  })));
  return images.filter(i => !(i.naturalWidth > 0)).map(i => i.currentSrc || i.src);
}"""

_WIDGETS_RENDERED = """() => {
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
  const rendered = Array.from(document.querySelectorAll('.widget-subarea'))
                        .filter(d => d.children.length > 0).length;
  return rendered >= views;
}"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # keep the test output clean
        pass


@contextlib.contextmanager
def serve(html_dir: Path):
    """Serve ``html_dir`` with a Python http.server thread on 127.0.0.1 (a free port); yields the base URL."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(html_dir))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class LinkChecker:
    """HTTP status and element ids of local files, each fetched once."""

    def __init__(self):
        self.status: dict[str, int] = {}
        self.ids: dict[str, set[str]] = {}

    def problem(self, href: str) -> str | None:
        url, fragment = urldefrag(href)
        if url not in self.status:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    self.status[url] = response.status
                    body = response.read().decode("utf-8", "replace") if url.endswith((".html", "/")) else ""
                    self.ids[url] = set(re.findall(r'\bid="([^"]+)"', body))
            except urllib.error.HTTPError as error:
                self.status[url] = error.code
        if self.status[url] != 200:
            return f"{href} -> HTTP {self.status[url]}"
        if fragment and self.ids.get(url) and fragment not in self.ids[url]:
            return f"{href} -> no element with id {fragment!r}"
        return None


def open_page(context, url: str, problems: list[str]):
    """A new page at ``url`` that records console errors, uncaught exceptions, failed local files and
    every request that would leave localhost (those are blocked) into ``problems``."""
    page = context.new_page()

    def route(route):
        if urlsplit(route.request.url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            problems.append(f"request leaves localhost: {route.request.url}")
            route.abort()

    page.route("**/*", route)
    page.on(
        "console",
        lambda m: (
            m.type == "error" and problems.append(f"console error: {m.text} {m.location.get('url', '')}")
        ),
    )
    page.on("pageerror", lambda e: problems.append(f"uncaught exception: {e}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    page.on("websocket", lambda ws: problems.append(f"websocket: {ws.url}"))
    page.goto(url, wait_until="load")
    return page


def check_page(
    context, base_url: str, page_path: str, html_dir: Path, links: LinkChecker, screenshot: Path | None = None
) -> list[str]:
    """Everything wrong with one page, as readable lines (empty when the page is fine)."""
    problems: list[str] = []
    page = open_page(context, base_url + page_path, problems)
    try:
        source = (html_dir / page_path).read_text(encoding="utf-8")
        redirect = re.search(r'http-equiv="refresh"[^>]*url=([^"]+)"', source, re.IGNORECASE)
        if redirect:  # Jupyter Book's root index.html only forwards to the first page
            target = urljoin(base_url + page_path, redirect.group(1))
            page.wait_for_url(lambda url: url.startswith(target), timeout=WAIT_MS)
            page.wait_for_load_state("load")

        if page.locator(".math").count():
            if not page.locator("script[src*='mathjax' i]").count():
                problems.append("the page has math but loads no MathJax")
            else:
                try:
                    page.wait_for_function(
                        "() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=WAIT_MS
                    )
                    page.evaluate("() => MathJax.startup.promise")
                except Exception as error:  # report it with the page's other problems, not as a traceback
                    problems.append(f"MathJax did not start: {str(error).splitlines()[0]}")
        math = page.evaluate(_MATH)
        problems += [f"math not typeset: {m!r}" for m in math["untypeset"]]
        problems += [f"raw {s} left in the text (math not parsed or not typeset)" for s in math["raw"]]

        if page.locator('script[type="application/vnd.jupyter.widget-state+json"]').count():
            try:
                page.wait_for_function(_WIDGETS_RENDERED, timeout=WAIT_MS)
            except Exception:
                problems.append("ipywidgets did not render (a widget view is left without its widget)")

        problems += [f"image does not load: {src}" for src in page.evaluate(_IMAGES)]

        hrefs = page.eval_on_selector_all("a[href]", "anchors => anchors.map(a => a.href)")
        for href in sorted(set(hrefs)):
            if urlsplit(href).hostname in LOCAL_HOSTS:
                problem = links.problem(href)
                if problem:
                    problems.append(f"broken link: {problem}")

        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=FULL_SCREENSHOTS)
    finally:
        page.close()
    return problems
