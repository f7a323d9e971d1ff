"""kvbook_sphinx serves MathJax and the widget scripts from the book: the configured scripts are
local, a build copies every one of them, and missing assets or a CDN URL stop the build with a
one-line fix. (tests/browser/ then checks the built pages in Chromium.) For the Japanese edition:
one catalogue per page, the executed notebooks rendered instead of the sources (a stale copy stops
the build), the language links, the edition's config and the catalogues' counts
(kvbook_sphinx/i18n.py; tests/test_translations.py checks the real catalogues and a tiny build)."""

from types import SimpleNamespace

import nbformat
import pytest
import yaml
from babel.messages.catalog import Catalog
from babel.messages.pofile import write_po
from sphinx.builders.html._assets import _JavaScript
from sphinx.errors import ExtensionError

import kvbook_sphinx
from kvbook_sphinx import i18n
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


# ---- the translated editions (kvbook_sphinx/i18n.py; the Japanese edition at ja/)


def test_one_catalogue_per_page_without_locations():
    config = SimpleNamespace(gettext_compact=True, gettext_location=True)
    kvbook_sphinx.catalogue_per_page(None, config)
    assert config.gettext_compact is False and config.gettext_location is False


def _nb(*sources, output=None) -> str:
    cells = [nbformat.v4.new_markdown_cell(sources[0])] + [nbformat.v4.new_code_cell(s) for s in sources[1:]]
    if output is not None:
        cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    return nbformat.writes(nbformat.v4.new_notebook(cells=cells))


def _env_app(srcdir, docname_suffix=".ipynb"):
    return SimpleNamespace(
        env=SimpleNamespace(doc2path=lambda docname: str(srcdir / f"{docname}{docname_suffix}"))
    )


def test_the_executed_copy_replaces_the_source(tmp_path, monkeypatch):
    executed = tmp_path / "jupyter_execute" / "book" / "page.ipynb"
    executed.parent.mkdir(parents=True)
    executed.write_text(_nb("# Page", "print(6 * 7)", output="42\n"))
    monkeypatch.setenv(kvbook_sphinx.OUTPUTS_ENV, str(tmp_path / "jupyter_execute"))
    source = [_nb("# Page", "print(6 * 7)")]
    kvbook_sphinx.executed_notebooks(_env_app(tmp_path), "book/page", source)
    assert nbformat.reads(source[0], as_version=4).cells[1].outputs[0]["text"] == "42\n"


def test_a_stale_or_missing_executed_copy_stops_the_build(tmp_path, monkeypatch):
    folder = tmp_path / "jupyter_execute"
    folder.mkdir()
    (folder / "page.ipynb").write_text(_nb("# Page", "print(6 * 7)", output="42\n"))
    monkeypatch.setenv(kvbook_sphinx.OUTPUTS_ENV, str(folder))
    with pytest.raises(ExtensionError, match="cells differ"):
        kvbook_sphinx.executed_notebooks(_env_app(tmp_path), "page", [_nb("# Page", "print(6 * 8)")])
    with pytest.raises(ExtensionError, match="has no other.ipynb: build the English edition first"):
        kvbook_sphinx.executed_notebooks(_env_app(tmp_path), "other", [_nb("# Other", "1")])


def test_without_executed_copies_the_sources_are_rendered(tmp_path, monkeypatch):
    monkeypatch.delenv(kvbook_sphinx.OUTPUTS_ENV, raising=False)
    text = _nb("# Page", "1")
    source = [text]
    kvbook_sphinx.executed_notebooks(_env_app(tmp_path), "page", source)
    assert source == [text]
    monkeypatch.setenv(kvbook_sphinx.OUTPUTS_ENV, str(tmp_path))  # a Markdown page is left alone
    markdown = ["# Intro"]
    kvbook_sphinx.executed_notebooks(_env_app(tmp_path, ".md"), "intro", markdown)
    assert markdown == ["# Intro"]


def _page_app(language):
    return SimpleNamespace(
        config=SimpleNamespace(language=language),
        builder=SimpleNamespace(get_target_uri=lambda pagename: f"{pagename}.html"),
    )


@pytest.mark.parametrize(
    "language, pagename, href",
    [
        ("en", "book/02_cache_size", "../ja/book/02_cache_size.html"),
        ("en", "index", "ja/index.html"),
        ("ja", "book/02_cache_size", "../../book/02_cache_size.html"),
        ("ja", "search", "../search.html"),
        (None, "book/intro", "../ja/book/intro.html"),  # Sphinx's default language is English
    ],
)
def test_every_page_links_the_same_page_in_the_other_language(language, pagename, href):
    context = {"body": "<section>text</section>", "metatags": '<meta name="x" />'}
    kvbook_sphinx.language_links(_page_app(language), pagename, "page.html", context, None)
    other = "en" if language == "ja" else "ja"
    name = kvbook_sphinx.LANGUAGE_NAMES[other]
    assert context["body"].startswith('<p class="kvbook-languages"')
    assert f'href="{href}" hreflang="{other}" lang="{other}">{name}</a>' in context["body"]
    assert context["body"].endswith("<section>text</section>")
    assert (
        context["metatags"] == f'<meta name="x" /><link rel="alternate" hreflang="{other}" href="{href}" />'
    )


def test_a_page_without_a_body_gets_the_alternate_link_only():
    context = {}
    kvbook_sphinx.language_links(_page_app("ja"), "genindex", "genindex.html", context, None)
    assert context == {"metatags": '<link rel="alternate" hreflang="en" href="../genindex.html" />'}


def test_a_language_without_an_edition_gets_no_links():
    context = {"body": "text"}
    kvbook_sphinx.language_links(_page_app("fr"), "book/intro", "page.html", context, None)
    assert context == {"body": "text"}


def _po(path, entries, language="ja"):
    """entries: (msgid, msgstr, fuzzy) triples written as a .po file."""
    catalog = Catalog(locale=language)
    for msgid, msgstr, fuzzy in entries:
        catalog.add(msgid, msgstr, flags=["fuzzy"] if fuzzy else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        write_po(out, catalog)


def test_the_edition_config_sets_the_language_and_translates_the_title(tmp_path):
    (tmp_path / "_config.yml").write_text(
        yaml.safe_dump({"title": "A book", "author": "Us", "sphinx": {"config": {"mathjax_path": "m.js"}}})
    )
    (tmp_path / "_toc.yml").write_text(
        yaml.safe_dump(
            {
                "root": "intro",
                "parts": [
                    {"caption": "Chapters", "chapters": [{"file": "a"}]},
                    {"caption": "Reference", "chapters": [{"file": "b"}]},
                ],
            }
        )
    )
    _po(
        i18n.catalogue_dir("ja", tmp_path) / "_config.po",
        [("A book", "本", False), ("Us", "私たち", True), ("Chapters", "各章", False)],
    )
    out = tmp_path / "_build" / "ja" / "_config.yml"
    i18n.edition_config("ja", out, root=tmp_path)
    config = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert config["sphinx"]["config"] == {"mathjax_path": "m.js", "language": "ja"}
    assert (config["title"], config["author"]) == ("本", "Us")  # a fuzzy translation is not used
    toc = yaml.safe_load((out.parent / "_toc.yml").read_text(encoding="utf-8"))
    # the captions translated (an untranslated one stays English), the files as they were
    assert [(p["caption"], p["chapters"]) for p in toc["parts"]] == [
        ("各章", [{"file": "a"}]),
        ("Reference", [{"file": "b"}]),
    ]
    with pytest.raises(SystemExit, match="no 'fr' edition"):
        i18n.edition_config("fr", out, root=tmp_path)


def test_the_config_catalogue_holds_the_title_author_and_captions(tmp_path):
    (tmp_path / "_config.yml").write_text(yaml.safe_dump({"title": "A book", "author": "Us"}))
    (tmp_path / "_toc.yml").write_text(yaml.safe_dump({"parts": [{"caption": "Chapters", "chapters": []}]}))
    pot = i18n.write_config_pot(tmp_path / "pot", root=tmp_path)
    assert [m.id for m in i18n.read_catalogue(pot, "en") if m.id] == ["A book", "Us", "Chapters"]


def test_catalogue_states_count_untranslated_and_fuzzy_messages(tmp_path):
    folder = i18n.catalogue_dir("ja", tmp_path)
    _po(folder / "book" / "page.po", [("One", "一", False), ("Two", "", False), ("Three", "三?", True)])
    _po(folder / "_config.po", [("Title", "題", False)])
    states = i18n.catalogue_states("ja", tmp_path)
    assert states == [
        i18n.CatalogueState("_config.po", messages=1, untranslated=0, fuzzy=0),
        i18n.CatalogueState("book/page.po", messages=3, untranslated=1, fuzzy=1),
    ]
    report = i18n.status_report("ja", tmp_path)
    assert "book/page.po" in report and "to translate" in report and "1 of 2 catalogues" in report


@pytest.mark.parametrize(
    "msgstr, problems",
    [
        ("{term}`KVキャッシュ` は $2 L$ バイト（{cite:p}`kvarticle`、`kvlib.sizing`、262,144）。", []),
        (
            "{ref}`式 <the-formula>` を参照: {term}`KVキャッシュ` $2 L$ `kvlib.sizing` "
            "{cite:p}`kvarticle` 262,144",
            [],
        ),
        ("{term}`KVキャッシュ` は $2 L$ バイト（`kvlib.sizing`、262,144）。", ["lost '{cite:p}`kvarticle`'"]),
        ("KVキャッシュ は $2L$ {cite:p}`kvarticle` `kvlib.sizing` 262144", None),
        ("", []),  # untranslated: nothing lost yet
    ],
)
def test_a_translation_keeps_code_math_references_and_numbers(msgstr, problems):
    msgid = "The {term}`KV cache` is $2 L$ bytes {cite:p}`kvarticle` (`kvlib.sizing`, 262,144)."
    if "<the-formula>" in msgstr:
        msgid = "See {ref}`the formula <the-formula>`: " + msgid
    found = i18n.message_problems(msgid, msgstr)
    if problems is None:  # several at once
        assert set(found) == {"lost '{term}'", "lost '$2 L$'", "added '$2L$'", "lost the number 262,144"}
    else:
        assert found == problems


def test_a_pages_heading_slugs_are_put_back_after_translation():
    # the translated messages' parses left the slugs of one Japanese heading; the page keeps the full set
    env = SimpleNamespace(
        docname="book/02", metadata={"book/02": {"myst_slugs": {"要点": (3, "id1", "要点")}}}
    )
    doctree = SimpleNamespace(myst_slugs={"the-formula": (10, "the-formula", "The formula")})
    kvbook_sphinx.keep_heading_slugs(SimpleNamespace(env=env), doctree)
    assert env.metadata["book/02"]["myst_slugs"] == {"the-formula": (10, "the-formula", "The formula")}


def test_a_page_without_headings_keeps_its_metadata():
    env = SimpleNamespace(docname="book/x", metadata={"book/x": {"title": "x"}})
    kvbook_sphinx.keep_heading_slugs(SimpleNamespace(env=env), SimpleNamespace())
    assert env.metadata["book/x"] == {"title": "x"}
