"""Sphinx extension that makes the published book work offline (every chapter's page).

The HTML of the book loads MathJax (math) and, on pages with ipywidgets (such as chapter 2's
calculator), RequireJS and the widgets' HTML manager. By default Sphinx and myst-nb take
those from CDNs; kvbook serves pinned copies instead, so a page renders with no network at
all and looks the same in ten years. The copies come from ``node_modules/`` (``package.json``
pins them, ``package-lock.json`` locks them, ``make assets`` fetches them with
kvbook_sphinx/assets.py); this extension copies the files the pages use into
``_static/offline/`` of the HTML output, and fails the build with a one-line fix when they
are missing or when a configured script is not local. It also drops the duplicate inline
script Jupyter Book registers on every page (:func:`drop_duplicate_scripts`), and lets
``make test`` render the committed, executed notebooks without running them a second time
(:func:`execution_from_environment`).

It also carries the translated editions (kvbook_sphinx/i18n.py: the Japanese edition at ``ja/``):
one gettext catalogue per page (:func:`catalogue_per_page`), the Japanese build rendering the
notebooks as the English build just executed them instead of executing them again
(:func:`executed_notebooks`), and on every page a link to the same page in the other language
(:func:`language_links`).

_config.yml points ``mathjax_path`` and ``nb_ipywidgets_js`` at ``offline/...``, paths
relative to ``_static/``. The browser tests (tests/browser/) check that no page requests
anything from outside the book.
"""

from __future__ import annotations

import filecmp
import html
import json
import os
import shutil
from pathlib import Path

import nbformat
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

ROOT = Path(__file__).resolve().parent.parent
NODE_MODULES = ROOT / "node_modules"
VENDOR = "offline"  # under _static/ (the theme itself uses _static/vendor/)
FIX = (
    "run `make assets` (it fetches the npm packages pinned in package-lock.json; see kvbook_sphinx/assets.py)"
)

# source under node_modules/ -> destination under _static/offline/
ASSETS = {
    "mathjax/es5": "mathjax",
    "mathjax/LICENSE": "mathjax/LICENSE",
    "requirejs/require.js": "requirejs/require.js",  # its MIT licence is in the file's header
    # embed-amd.js bundles the standard widgets; the font files in dist/ are the Font Awesome icons it loads.
    "@jupyter-widgets/html-manager/dist": "html-manager",
}
SKIP = ("*.map", "embed.js", "libembed-amd.js")  # not loaded by the pages
# kvbook's own script, next to the others: points the widget manager at its fonts, bridges MathJax 2 -> 3.
OWN = {Path(__file__).with_name("widgets-setup.js"): "widgets-setup.js"}


def _sources() -> list[tuple[Path, str]]:
    """Every (source path, destination under offline/) pair; a one-line error when one is missing."""
    pairs = list(OWN.items())
    for source, dest in ASSETS.items():
        path = NODE_MODULES / source
        if not path.exists():
            raise ExtensionError(f"kvbook: offline assets missing (node_modules/{source} not found): {FIX}")
        pairs.append((path, dest))
    return pairs


def _copy_if_changed(source: str, target: str) -> None:
    """Copy unless ``target`` already holds the same bytes (shutil's ``copy_function``)."""
    # by content: npm gives every unpacked file the same old timestamp, so times cannot tell versions apart
    if not (Path(target).exists() and filecmp.cmp(source, target, shallow=False)):
        shutil.copyfile(source, target)


def _local_scripts(app: Sphinx) -> list[str]:
    """The configured script paths; each must be relative (served from _static/)."""
    paths = [app.config.mathjax_path, *getattr(app.config, "nb_ipywidgets_js", {}).keys()]
    for path in paths:
        if "://" in path or path.startswith("//"):
            raise ExtensionError(
                f"kvbook: {path} is loaded from the network; point it at _static/{VENDOR}/ (see _config.yml)"
            )
    return paths


def check_assets(app: Sphinx) -> None:
    """Fail before executing any notebook when the assets are missing or a script is remote."""
    if app.builder.format != "html":
        return
    _sources()
    _local_scripts(app)


def copy_assets(app: Sphinx, exception: Exception | None) -> None:
    """Copy the pinned assets into _static/offline/ and check every configured script is there."""
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    for source, dest in _sources():
        target = static / VENDOR / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(
                source,
                target,
                ignore=shutil.ignore_patterns(*SKIP),
                copy_function=_copy_if_changed,
                dirs_exist_ok=True,
            )
        else:
            _copy_if_changed(str(source), str(target))
    for path in _local_scripts(app):
        if not (static / path).is_file():
            raise ExtensionError(
                f"kvbook: {path} is configured but _static/{path} was not produced; "
                f"the assets in kvbook_sphinx.ASSETS do not contain it"
            )


def drop_duplicate_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Keep the first of identical <script> entries of a page.

    Under Jupyter Book 1.x sphinx-thebe registers its inline settings twice; both copies declare
    `const THEBE_JS_URL`, so every page logged a SyntaxError in the browser console.
    """
    unique = {}
    for script in context.get("script_files", []):
        # the two copies differ only in filename None vs "" (an inline script has no file)
        key = (
            getattr(script, "filename", script) or "",
            getattr(script, "priority", 0),
            tuple(sorted(getattr(script, "attributes", {}).items())),
        )
        unique.setdefault(key, script)
    context["script_files"] = list(unique.values())


EXECUTION_ENV = "KVBOOK_NB_EXECUTION"  # overrides _config.yml's execute_notebooks for one build
EXECUTION_MODES = ("force", "off")


def execution_from_environment(app: Sphinx, config) -> None:
    """Take myst-nb's execution mode from ``KVBOOK_NB_EXECUTION`` when it is set ("force" or "off").

    ``make book`` executes every notebook (``_config.yml``: force). ``make test`` runs nbval
    first, which executes every notebook afresh and compares each checked output with the
    committed one; its build then renders those committed outputs (``off``) instead of
    executing the notebooks a second time, which halved the build's time.
    """
    mode = os.environ.get(EXECUTION_ENV, "")
    if not mode:
        return
    if mode not in EXECUTION_MODES:
        raise ExtensionError(
            f"kvbook: {EXECUTION_ENV} must be one of {', '.join(EXECUTION_MODES)}, not {mode!r}"
        )
    config.nb_execution_mode = mode


def catalogue_per_page(app: Sphinx, config) -> None:
    """One gettext catalogue per page (book/02_cache_size.pot, .po), not one per folder (book.pot).

    Translators then work on pages in parallel, and an English change touches only its page's
    catalogue. The gettext build (``make translations``) and the translated builds must agree.
    Messages keep the order of the page; their locations (a notebook's cell and line) are left
    out, so that inserting a cell does not rewrite every later location in the .po files.
    """
    config.gettext_compact = False
    config.gettext_location = False


OUTPUTS_ENV = "KVBOOK_NB_OUTPUTS"  # a folder of executed notebooks to render instead of the sources


def _cells(notebook) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


def executed_notebooks(app: Sphinx, docname: str, source: list[str]) -> None:
    """Render the executed copy of each notebook found in the folder ``KVBOOK_NB_OUTPUTS`` names.

    myst-nb writes every notebook it renders, outputs included, to ``_build/jupyter_execute/``.
    The Japanese edition is built after the English one with execution off and this variable set
    to that folder, so its pages show the outputs the English build has just produced (executed
    by ``make book``, the committed ones in ``make test``) and no notebook runs twice. The copy
    must have the same cells as the source: one left over from an older source stops the build.
    """
    folder = os.environ.get(OUTPUTS_ENV, "")
    path = Path(app.env.doc2path(docname))
    if not folder or path.suffix != ".ipynb":
        return
    executed = Path(folder, *f"{docname}.ipynb".split("/"))
    if not executed.is_file():
        raise ExtensionError(
            f"kvbook: {OUTPUTS_ENV}={folder} has no {docname}.ipynb: build the English edition first "
            f"(make book or make build-check), whose executed notebooks the other editions render"
        )
    text = executed.read_text(encoding="utf-8")
    if _cells(nbformat.reads(text, as_version=4)) != _cells(nbformat.reads(source[0], as_version=4)):
        raise ExtensionError(
            f"kvbook: {executed} is not the executed {path.name} (their cells differ): "
            f"build the English edition again first"
        )
    source[0] = _with_glue(text, executed.with_name(f"{executed.stem}.glue.json"))


def _with_glue(text: str, glue_file: Path) -> str:
    """The executed notebook ``text`` with the values its cells glued put back.

    myst-nb takes every glued value out of the cells it renders and keeps them beside the copy it
    writes, in ``<page>.glue.json``; the copy alone would give the other editions' prose nothing
    to paste. The values go back as the hidden outputs ``glue()`` makes, on the first code cell.
    """
    if not glue_file.is_file():
        return text
    from myst_nb.ext.glue import GLUE_PREFIX

    notebook = nbformat.reads(text, as_version=4)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    if not code_cells:
        return text
    for output in json.loads(glue_file.read_text(encoding="utf-8")).values():
        output = dict(output)
        output["data"] = {GLUE_PREFIX + mime: value for mime, value in output["data"].items()}
        code_cells[0].setdefault("outputs", []).append(nbformat.from_dict(output))
    return nbformat.writes(notebook)


# Every edition's folder under the English edition's root (kvbook_sphinx.i18n.EDITIONS), and the
# name of each language written in that language.
LANGUAGE_NAMES = {"en": "English", "ja": "日本語"}


def edition_language(config) -> str:
    """The language of the edition being built (Sphinx's ``language``; en when unset)."""
    return (config.language or "en").split("_")[0]


def language_links(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Link every page to the same page in the other editions: a line above the page's text and a
    ``<link rel="alternate" hreflang>`` in its head. Relative links, so they work from any folder
    or host: from book/02_cache_size.html to ja/book/02_cache_size.html and back (../../book/...).
    """
    from kvbook_sphinx.i18n import EDITIONS

    here = edition_language(app.config)
    if here not in EDITIONS:
        return
    target = app.builder.get_target_uri(pagename)
    # up from this page to its edition's root, then up from there to the English root
    english_root = "../" * (target.count("/") + EDITIONS[here].count("/"))
    anchors, alternates = [], []
    for language, folder in EDITIONS.items():
        if language == here:
            continue
        href = html.escape(f"{english_root}{folder}{target}")
        name = LANGUAGE_NAMES.get(language, language)
        anchors.append(
            f'<a class="kvbook-language" href="{href}" hreflang="{language}" lang="{language}">{name}</a>'
        )
        alternates.append(f'<link rel="alternate" hreflang="{language}" href="{href}" />')
    context["metatags"] = context.get("metatags", "") + "\n".join(alternates)
    if "body" in context:  # pages rendered from a document (not genindex or search)
        line = f'<p class="kvbook-languages" style="text-align: right">{" · ".join(anchors)}</p>\n'
        context["body"] = line + context["body"]


def keep_heading_slugs(app: Sphinx, doctree) -> None:
    """Keep a page's heading anchors those of its English headings, in every edition.

    myst-parser files a page's heading slugs (``#the-formula``) in the environment when it parses
    the page; Sphinx's translation then parses each translated message again with the same parser,
    and every such parse overwrites the page's slugs with those of its own few words, so that links
    such as ``02_cache_size.ipynb#the-formula`` no longer resolve in the Japanese edition. The page's
    document keeps the slugs of the full parse: they are put back once the page has been read (the
    sections keep their English ids beside the translated titles, so the links land).
    """
    slugs = getattr(doctree, "myst_slugs", None)
    if slugs and app.env.docname in app.env.metadata:
        app.env.metadata[app.env.docname]["myst_slugs"] = slugs


def fixed_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{fixed}`1,555 GB/s```: a published or fixed figure (a data sheet, a paper, a config, an
    exercise's given), shown as plain text.

    The role is the explicit mark that a number in the prose is not a result of this run:
    tests/test_prose_numbers.py fails on any number of the prose that is neither pasted from the
    notebook's outputs (``{glue:text}``) nor marked this way. It renders exactly its text.
    """
    from docutils import nodes

    return [nodes.inline(rawtext, text, classes=["kvbook-fixed"])], []


def _paste_text_role():
    """myst-nb's ``{glue:text}`` role, made to work in a translated message too.

    Sphinx parses each translated message (the Japanese edition's ``msgstr``) as a small document
    of its own, which does not carry the notebook's glue data, so myst-nb's role finds no key
    there. In such a document the role pastes from the page's own notebook the way myst-nb pastes
    from another page: a pending reference, resolved from the glue cache myst-nb wrote while it
    read the page. Both editions then show the same values of this run.
    """
    from myst_nb.ext.glue.roles import PasteTextRole
    from myst_nb.ext.glue.utils import PendingGlueReferenceError, create_pending_glue_ref, glue_warning

    class TranslatablePasteTextRole(PasteTextRole):
        def run(self):
            if "nb_renderer" in self.document or "::" in self.text:
                return super().run()
            key, _, fmt_spec = self.text.rpartition(":") if ":" in self.text else (self.text, "", "s")
            env = self.document.settings.env
            try:
                ref = create_pending_glue_ref(
                    self.document,
                    self.source,
                    self.line,
                    "/" + str(env.doc2path(env.docname, False)),
                    key,
                    inline=True,
                    gtype="text",
                    fmt_spec=fmt_spec or "s",
                )
            except PendingGlueReferenceError as exc:
                return [], [glue_warning(str(exc), self.document, self.line)]
            return [ref], []

    return TranslatablePasteTextRole()


def setup(app: Sphinx) -> dict:
    """Sphinx's entry point: connect the checks, the copy and the script filter to the build."""
    app.setup_extension("myst_nb")  # its glue domain must exist before one of its roles is replaced
    app.add_role("fixed", fixed_role)
    app.add_role_to_domain("glue", "text", _paste_text_role(), override=True)
    app.connect("config-inited", execution_from_environment)
    app.connect("config-inited", catalogue_per_page)
    app.connect("source-read", executed_notebooks)
    app.connect("doctree-read", keep_heading_slugs)
    app.connect("html-page-context", language_links)
    app.connect("builder-inited", check_assets)
    app.connect("build-finished", copy_assets)
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)  # after the others added theirs
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
