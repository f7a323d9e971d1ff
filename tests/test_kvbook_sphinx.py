"""kvbook_sphinx serves MathJax and the widget scripts from the book: the configured scripts are
local, a build copies every one of them, and missing assets or a CDN URL stop the build with a
one-line fix. (tests/browser/ then checks the built pages in Chromium.)"""

from types import SimpleNamespace

import pytest
import yaml
from sphinx.builders.html._assets import _JavaScript
from sphinx.errors import ExtensionError

import kvbook_sphinx
from tests.toc import ROOT

SPHINX_CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["sphinx"]["config"]


def _app(outdir, **config):
    settings = {
        "mathjax_path": SPHINX_CONFIG["mathjax_path"],
        "nb_ipywidgets_js": SPHINX_CONFIG["nb_ipywidgets_js"],
    }
    settings.update(config)
    return SimpleNamespace(
        builder=SimpleNamespace(format="html"), outdir=str(outdir), config=SimpleNamespace(**settings)
    )


def test_the_book_loads_math_and_widgets_from_itself():
    scripts = [SPHINX_CONFIG["mathjax_path"], *SPHINX_CONFIG["nb_ipywidgets_js"]]
    assert len(scripts) == 4
    assert all(path.startswith(f"{kvbook_sphinx.VENDOR}/") for path in scripts), scripts


def test_a_build_copies_every_configured_script(tmp_path):
    kvbook_sphinx.copy_assets(_app(tmp_path), None)
    static = tmp_path / "_static"
    for path in [SPHINX_CONFIG["mathjax_path"], *SPHINX_CONFIG["nb_ipywidgets_js"]]:
        assert (static / path).is_file(), path
    # MathJax loads its fonts and extensions from its own folder at run time
    assert list((static / "offline/mathjax/output/chtml/fonts/woff-v2").glob("*.woff"))
    assert not list(static.rglob("*.map")), "source maps are not served"


def test_a_cdn_url_stops_the_build(tmp_path):
    app = _app(tmp_path, mathjax_path="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js")
    with pytest.raises(ExtensionError, match="loaded from the network"):
        kvbook_sphinx.check_assets(app)


def test_a_configured_script_that_is_not_copied_stops_the_build(tmp_path):
    app = _app(tmp_path, nb_ipywidgets_js={"offline/no-such-script.js": {}})
    with pytest.raises(ExtensionError, match="no-such-script.js"):
        kvbook_sphinx.copy_assets(app, None)


def test_missing_node_modules_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(kvbook_sphinx, "NODE_MODULES", tmp_path / "node_modules")
    with pytest.raises(ExtensionError, match=r"offline assets missing .*make assets"):
        kvbook_sphinx.check_assets(_app(tmp_path))


def test_identical_inline_scripts_are_kept_once():
    thebe = "const THEBE_JS_URL = 'x'"
    context = {
        "script_files": [
            _JavaScript(None, body=thebe),
            _JavaScript("a.js"),
            _JavaScript("", body=thebe),
            _JavaScript(None, body="let other = 1"),
        ]
    }
    kvbook_sphinx.drop_duplicate_scripts(None, "page", "page.html", context, None)
    assert [(js.filename, js.attributes.get("body")) for js in context["script_files"]] == [
        (None, thebe),
        ("a.js", None),
        (None, "let other = 1"),
    ]


@pytest.mark.parametrize("mode", ["force", "off"])
def test_the_environment_sets_the_execution_mode(monkeypatch, mode):
    config = SimpleNamespace(nb_execution_mode="force" if mode == "off" else "off")
    monkeypatch.setenv(kvbook_sphinx.EXECUTION_ENV, mode)
    kvbook_sphinx.execution_from_environment(None, config)
    assert config.nb_execution_mode == mode


def test_without_the_environment_the_config_decides(monkeypatch):
    config = SimpleNamespace(nb_execution_mode="force")
    monkeypatch.delenv(kvbook_sphinx.EXECUTION_ENV, raising=False)
    kvbook_sphinx.execution_from_environment(None, config)
    assert config.nb_execution_mode == "force"


def test_an_unknown_execution_mode_stops_the_build(monkeypatch):
    monkeypatch.setenv(kvbook_sphinx.EXECUTION_ENV, "cache")
    with pytest.raises(ExtensionError, match="KVBOOK_NB_EXECUTION must be one of force, off, not 'cache'"):
        kvbook_sphinx.execution_from_environment(None, SimpleNamespace(nb_execution_mode="force"))
