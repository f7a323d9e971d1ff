"""Fixtures of the browser tests: the built book served on localhost and a headless Chromium.

The tests read HTML that is already built (``make test`` builds it in ``build-check`` first):
``_build/html`` by default, or the folder named by ``KVBOOK_HTML``. They need Chromium
(Debian: ``apt-get install chromium``; another binary: ``KVBOOK_CHROMIUM=/path``) and fail
without it, unless ``KVBOOK_SKIP_BROWSER=1`` is set: then they are skipped and pytest's
``-rs`` summary says so. Screenshots go to ``test-artifacts/screenshots/`` (``KVBOOK_ARTIFACTS``
moves the folder; ``KVBOOK_FULL_SCREENSHOTS=1`` captures whole pages instead of their top).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.browser.pagecheck import LinkChecker, serve
from tests.toc import ROOT

HTML_DIR = Path(os.environ.get("KVBOOK_HTML", ROOT / "_build" / "html")).resolve()
ARTIFACTS = Path(os.environ.get("KVBOOK_ARTIFACTS", ROOT / "test-artifacts")).resolve()
SKIP_BROWSER = os.environ.get("KVBOOK_SKIP_BROWSER", "") not in ("", "0")
INSTALL = (
    "install it with `apt-get install chromium` (Debian/Ubuntu, as root), or set KVBOOK_CHROMIUM to a "
    "Chromium binary; KVBOOK_SKIP_BROWSER=1 skips the browser tests"
)
# Flags that keep Chromium from talking to Google's hosts on its own (updates, sync, QUIC probes).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NOT_PAGES = {"genindex.html", "search.html"}


def built_pages(html_dir: Path = HTML_DIR) -> list[str]:
    """Every HTML page of the built book, relative to its root (new chapters are found automatically),
    the Japanese edition's under ja/ included (not the theme's templates under _static/)."""
    if not html_dir.is_dir():
        return []
    return sorted(
        p.relative_to(html_dir).as_posix()
        for p in html_dir.rglob("*.html")
        if p.name not in NOT_PAGES and not any(part.startswith("_") for part in p.relative_to(html_dir).parts)
    )


def pytest_collection_modifyitems(config, items):
    if not SKIP_BROWSER:
        return
    skip = pytest.mark.skip(
        reason="KVBOOK_SKIP_BROWSER is set: the browser tests did NOT run "
        "(unset it to run them; they need Chromium: `apt-get install chromium`)"
    )
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def html_dir() -> Path:
    if not (HTML_DIR / "index.html").is_file():
        pytest.fail(
            f"no built book at {HTML_DIR} (index.html missing): run `make build-check` or `make book` "
            f"first, or point KVBOOK_HTML at a built _build/html folder",
            pytrace=False,
        )
    return HTML_DIR


@pytest.fixture(scope="session")
def book_url(html_dir):
    """The built book served by a Python http.server thread on 127.0.0.1."""
    with serve(html_dir) as url:
        yield url


@pytest.fixture(scope="session")
def links() -> LinkChecker:
    return LinkChecker()


def find_chromium() -> str | None:
    explicit = os.environ.get("KVBOOK_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        where = (
            f"KVBOOK_CHROMIUM={os.environ['KVBOOK_CHROMIUM']} is not an executable"
            if os.environ.get("KVBOOK_CHROMIUM")
            else "no Chromium found on PATH (chromium, chromium-browser)"
        )
        pytest.fail(f"browser tests need Chromium: {where}; {INSTALL}", pytrace=False)
    return path


@pytest.fixture(scope="session")
def browser(chromium, tmp_path_factory):
    """A headless Chromium context with a fresh profile, driven by Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the browser tests need the python package playwright (requirements.txt): run `make test`",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """test-artifacts/screenshots/, emptied at the start of the session so no stale page remains."""
    folder = ARTIFACTS / "screenshots"
    if folder.is_dir():
        for old in folder.glob("*.png"):
            old.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    return folder
