"""A chapter opened in JupyterLab, where readers run the notebooks (``make lab``), in headless Chromium.

JupyterLab renders the markdown cells with jupyterlab-myst (pinned in requirements.txt), so the
book's MyST must come out there as it does in the HTML book: the colon-fence directives
(``:::{dropdown}``, ``:::{admonition}``, ``:::{note}``) parsed, not shown as text; every
"Worked solution" folded, its text hidden until the reader clicks it; the admonitions boxed.
The server runs on 127.0.0.1 on a free port with a token, on a copy of one short chapter in a
temporary folder (nothing of the repository is written), with its own settings, no kernel started
and no news or update check; the page may send no request away from localhost. The server is
stopped, with its process group, whatever the test's outcome.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.browser.pagecheck import LOCAL_HOSTS
from tests.toc import ROOT

NOTEBOOK = "00_measurements.ipynb"  # the shortest chapter with exercises, notes and admonitions
START_S = 30  # the server's start, bounded: about 2 s on the 2-core machine when it is quiet
RENDER_MS = 30_000  # JupyterLab's first load and the MyST rendering: about 4 s when quiet
SETTINGS = {  # JupyterLab's user settings for the test, in a folder of its own
    # every cell attached to the page (not only those in the viewport), so all dropdowns are there
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"},  # no news prompt
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:] if log.is_file() else "(no log)"


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (JupyterLab and anything it started), SIGKILL if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving a copy of NOTEBOOK: yields (url, token); stopped at the end of the module."""
    import importlib.util

    if importlib.util.find_spec("jupyterlab_myst") is None:
        pytest.fail(
            "jupyterlab-myst is not installed: `make browser` installs requirements.txt", pytrace=False
        )
    tmp = tmp_path_factory.mktemp("jupyterlab")
    notebooks = tmp / "book"
    notebooks.mkdir()
    shutil.copy(ROOT / "book" / NOTEBOOK, notebooks / NOTEBOOK)
    dirs = {name: tmp / name for name in ("config", "data", "runtime", "settings", "workspaces")}
    for folder in dirs.values():
        folder.mkdir()
    for plugin, values in SETTINGS.items():
        path = dirs["settings"] / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
        JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
    )
    port, token = _free_port(), secrets.token_hex(16)
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",  # CI runs as root
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={notebooks}",
        "--LabApp.notebook_starts_kernel=False",  # rendering needs no kernel
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    log = tmp / "jupyterlab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"JupyterLab exited ({proc.returncode}) before serving:\n{_log_tail(log)}", pytrace=False
                )
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"JupyterLab did not answer within {START_S} s:\n{_log_tail(log)}", pytrace=False
                    )
                time.sleep(0.3)
        yield url, token
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def notebook_page(lab, browser):
    """The chapter open in JupyterLab, once its markdown is rendered; (page, requests sent away)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    url, token = lab
    page = browser.new_page()
    away: list[str] = []

    def local_only(route):
        if urlsplit(route.request.url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            away.append(route.request.url)
            route.abort()

    page.route("**/*", local_only)
    try:
        page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}", timeout=RENDER_MS)
        # the last exercise's Worked solution: the notebook is open and its markdown rendered by MyST
        last = page.locator(".jp-MarkdownCell details > summary", has_text="Worked solution").nth(2)
        try:
            last.wait_for(state="attached", timeout=RENDER_MS)
        except PlaywrightTimeout:
            cells = page.locator(".jp-MarkdownCell").count()
            pytest.fail(
                f"{NOTEBOOK} in JupyterLab shows {cells} markdown cells but not its third Worked solution "
                f"dropdown within {RENDER_MS // 1000} s: is jupyterlab-myst rendering the markdown?",
                pytrace=False,
            )
        yield page, away
    finally:
        page.close()


def _worked_solutions(page):
    return page.locator(".jp-MarkdownCell details", has=page.locator("summary", has_text="Worked solution"))


def test_every_worked_solution_is_folded_until_clicked(notebook_page, screenshots):
    page, _ = notebook_page
    solutions = _worked_solutions(page)
    assert solutions.count() == 3, "chapter 0 has three exercises, each with a Worked solution dropdown"
    for i in range(solutions.count()):
        dropdown = solutions.nth(i)
        assert dropdown.evaluate("d => d.open") is False, f"Worked solution {i + 1} is open on arrival"
        body = dropdown.locator(":scope > :not(summary)")
        assert body.count() > 0 and body.first.is_hidden(), f"Worked solution {i + 1}'s text shows folded"
    first = solutions.first
    first.scroll_into_view_if_needed()
    first.locator("summary").click()
    body = first.locator(":scope > :not(summary)").first
    body.wait_for(state="visible", timeout=10_000)
    assert "the middle one is" in body.inner_text(), "the opened solution shows its text"
    first.screenshot(path=str(screenshots / "jupyterlab-worked-solution.png"))


def test_admonitions_render_and_no_colon_fence_shows_as_text(notebook_page):
    page, _ = notebook_page
    boxes = page.locator(".jp-MarkdownCell aside.myst-admonition")
    assert boxes.count() >= 4, "chapter 0's notes and admonitions are boxed by jupyterlab-myst"
    assert boxes.first.is_visible()
    # the rendered part of every markdown cell (textContent: folded dropdowns included, the editor not)
    rendered = page.evaluate(
        """() => Array.from(document.querySelectorAll('.jp-MarkdownCell .myst'))
                      .map(c => c.textContent)"""
    )
    cells = json.loads((ROOT / "book" / NOTEBOOK).read_text(encoding="utf-8"))["cells"]
    assert len(rendered) == sum(c["cell_type"] == "markdown" for c in cells), "every markdown cell renders"
    raw = [text[:80] for text in rendered if ":::" in text or "{dropdown}" in text or "{admonition}" in text]
    assert not raw, f"MyST directives shown as text, not parsed: {raw}"


def test_the_page_sends_no_request_away_from_localhost(notebook_page):
    _, away = notebook_page
    assert not away, f"JupyterLab's page asked hosts other than localhost: {away[:5]}"
