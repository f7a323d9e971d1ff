"""The Japanese edition's catalogues (locales/ja/LC_MESSAGES/*.po) and a tiny translated build.

- every catalogue parses and compiles (Sphinx compiles them to .mo when it builds the edition);
- there is one catalogue per page of _toc.yml (and _config.po for the title), none left over;
- each translated message keeps its code, math, references, links and numbers, and writes the
  glossary's Japanese terms (KVキャッシュ, プリフィル, ...) where the English has the English term;
- the edition is complete: no message untranslated or fuzzy, and the catalogues hold exactly
  the messages the English sources have now (`make translations` was run after the last English
  change). While locales/ja/.translation-in-progress exists these two are skipped, and the skip
  says so; the file is removed when the translators have finished;
- on a tiny book: the Japanese build shows the translations, says lang="ja", labels Sphinx's and
  the theme's controls in Japanese, renders the outputs the English build executed (the source
  has none), and every page links to its twin in the other edition.
"""

import os
import re
import subprocess
import sys
from io import BytesIO
from pathlib import Path

import nbformat
import pytest
import yaml
from babel.messages.catalog import Catalog
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po, write_po

import kvbook_sphinx
from kvbook_sphinx import i18n
from tests.toc import ROOT, toc_files

LANGUAGE = "ja"
CATALOGUES = i18n.catalogue_dir(LANGUAGE)
PO_FILES = sorted(CATALOGUES.rglob("*.po"))
IN_PROGRESS = ROOT / i18n.LOCALES / LANGUAGE / i18n.IN_PROGRESS


def _left() -> str:
    states = i18n.catalogue_states(LANGUAGE)
    untranslated, fuzzy = sum(s.untranslated for s in states), sum(s.fuzzy for s in states)
    return f"{untranslated} untranslated and {fuzzy} fuzzy messages in {len(states)} catalogues"


translation_in_progress = pytest.mark.skipif(
    IN_PROGRESS.exists(),
    reason=(
        f"the Japanese translation is in progress ({IN_PROGRESS.relative_to(ROOT)} exists; now "
        f"{_left() if IN_PROGRESS.exists() else ''}): untranslated, fuzzy and out-of-date messages are "
        "allowed until the lead removes that file when the translators have finished; "
        "`make translations` lists what is left per catalogue"
    ),
)
# English terms (as the prose writes them) -> the glossary entry whose Japanese term a translation uses
TERMS = {
    r"\bKV[- ]cache": "KV cache",
    r"(?<![-\w])attention\b(?![- ](?:sink|head))": "attention",
    r"\bprefill": "prefill",
    r"(?<!speculative )\bdecod(?:e|es|ed|ing)\b": "decode step",  # 投機的デコーディング is its own term
    r"\bblock tables?\b": "block table",
    r"\bthroughputs?\b": "throughput",
}


def _messages(path: Path):
    with path.open("rb") as po:
        catalogue = read_po(po, locale=LANGUAGE, abort_invalid=True)
    return catalogue, [m for m in catalogue if m.id]


def test_there_are_catalogues():
    assert PO_FILES, f"no catalogues under {CATALOGUES}: run `make translations`"


@pytest.mark.parametrize("path", PO_FILES, ids=lambda p: p.relative_to(CATALOGUES).as_posix())
def test_every_catalogue_compiles(path):
    catalogue, messages = _messages(path)
    assert catalogue.locale is not None and str(catalogue.locale) == LANGUAGE, f"{path}: Language is not ja"
    for message in messages:
        # babel flags any "5% of" as a Python format ("% o"): these messages are MyST prose, which no
        # format operator ever reads, and Sphinx compiles them without that check
        message.flags.discard("python-format")
    errors = [(m.id, [str(e) for e in errs]) for m, errs in catalogue.check()]
    assert errors == [], f"{path}: {errors}"
    compiled = BytesIO()
    write_mo(compiled, catalogue)
    assert len(compiled.getvalue()) > 0


def test_one_catalogue_per_page():
    expected = {f"{page}.po" for page in toc_files()} | {f"{i18n.CONFIG_CATALOGUE}.po"}
    present = {p.relative_to(CATALOGUES).as_posix() for p in PO_FILES}
    assert present == expected, (
        f"catalogues without a page (delete them): {sorted(present - expected)}; "
        f"pages without a catalogue (run `make translations`): {sorted(expected - present)}"
    )


def _glossary_terms() -> dict[str, str]:
    """English term -> Japanese term, from book/glossary.md (each entry: English line(s), then Japanese)."""
    terms, lines = {}, []
    for block in re.findall(r"```\{glossary\}\n(.*?)```", (ROOT / "book/glossary.md").read_text(), re.DOTALL):
        for line in block.splitlines():
            if line.startswith(":") or not line.strip():
                continue
            if line.startswith(" "):  # the definition: the term lines above it are complete
                if lines:
                    *english, japanese = lines
                    terms.update({e: japanese for e in english})
                lines = []
            else:
                lines.append(line.strip())
    return terms


def test_the_terms_checked_are_the_glossarys():
    glossary = _glossary_terms()
    missing = [entry for entry in TERMS.values() if entry not in glossary]
    assert missing == [], f"book/glossary.md has no entry {missing}: update TERMS in this file"
    assert re.fullmatch(r"[\w・ー]+", glossary["KV cache"]) and "キャッシュ" in glossary["KV cache"]


def _translated(path: Path):
    return [m for m in _messages(path)[1] if m.string and not m.fuzzy]


@pytest.mark.parametrize("path", PO_FILES, ids=lambda p: p.relative_to(CATALOGUES).as_posix())
def test_translations_keep_code_math_references_and_numbers(path):
    wrong = {m.id[:80]: i18n.message_problems(m.id, m.string) for m in _translated(path)}
    wrong = {msgid: problems for msgid, problems in wrong.items() if problems}
    assert wrong == {}, f"{path.relative_to(ROOT)}: translations that change what must stay: {wrong}"


@pytest.mark.parametrize("path", PO_FILES, ids=lambda p: p.relative_to(CATALOGUES).as_posix())
def test_translations_use_the_glossarys_terms(path):
    if path.name == "glossary.po":  # the glossary names every term in both languages itself
        return
    glossary = _glossary_terms()
    wrong = []
    for message in _translated(path):
        prose = re.sub(r"`[^`]*`|\$[^$]*\$", " ", message.id)  # code, roles and math are not prose
        for pattern, entry in TERMS.items():
            if re.search(pattern, prose, re.IGNORECASE) and glossary[entry] not in message.string:
                wrong.append(f"{message.id[:60]!r}: {entry!r} is {glossary[entry]} (book/glossary.md)")
    assert wrong == [], f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(wrong)


def test_the_checks_hold_for_the_english_messages_themselves():
    """Every message, as its own translation, keeps everything (the patterns parse the real text)."""
    for path in PO_FILES:
        for message in _messages(path)[1]:
            assert i18n.message_problems(message.id, message.id) == [], (path, message.id)


@translation_in_progress
def test_every_message_is_translated():
    """0 untranslated and 0 fuzzy messages in every catalogue (the counts of `make translations`)."""
    states = i18n.catalogue_states(LANGUAGE)
    left = [s for s in states if not s.done]
    assert left == [], "messages left to translate:\n" + i18n.status_report(LANGUAGE)


@pytest.mark.slow
@translation_in_progress
def test_the_catalogues_hold_the_messages_of_the_english_sources(tmp_path):
    """The catalogues were updated after the last English change (else the Japanese pages would
    show English for every changed paragraph, however complete the counts look)."""
    build = subprocess.run(
        [str(Path(sys.executable).parent / "jupyter-book"), "build", str(ROOT), "--builder", "custom"]
        + ["--custom-builder", "gettext", "--path-output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, kvbook_sphinx.EXECUTION_ENV: "off"},
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    pot_dir = tmp_path / "_build" / "gettext"
    i18n.write_config_pot(pot_dir)
    stale = {}
    for pot in sorted(pot_dir.rglob("*.pot")):
        name = pot.relative_to(pot_dir).with_suffix(".po")
        po = CATALOGUES / name
        expected = {m.id for m in _messages(pot)[1]}
        present = {m.id for m in _messages(po)[1]} if po.is_file() else set()
        if expected != present:
            stale[name.as_posix()] = f"{len(expected - present)} new, {len(present - expected)} gone"
    assert stale == {}, f"catalogues behind the English sources (run `make translations`): {stale}"


# ---- a tiny book in both editions


def _write_po(path: Path, translations: dict[str, str]) -> None:
    catalogue = Catalog(locale=LANGUAGE)
    for msgid, msgstr in translations.items():
        catalogue.add(msgid, msgstr)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        write_po(out, catalogue)


def _jupyter_book(*args, **env) -> subprocess.CompletedProcess:
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    return subprocess.run(
        [str(jupyter_book), "build", *map(str, args), "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )


GLUED_ENGLISH = (
    "The ratio is {glue:text}`ratio:.2f` and the claim {glue:text}`verdict`; paper: {fixed}`7.5x`."
)
GLUED_JAPANESE = "比は{glue:text}`ratio:.2f`で、主張は{glue:text}`verdict_ja`。論文では{fixed}`7.5x`。"


@pytest.fixture(scope="module")
def tiny_editions(tmp_path_factory):
    """A tiny book built as `make book` builds it: English (executing), then Japanese from the
    English build's executed notebooks. Returns the two HTML folders."""
    book = tmp_path_factory.mktemp("tiny")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["title"] = "A tiny book"
    (book / "_config.yml").write_text(yaml.safe_dump(config))
    for bib in config.get("bibtex_bibfiles", []):
        (book / bib).parent.mkdir(parents=True, exist_ok=True)
        (book / bib).write_text((ROOT / bib).read_text())
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: page\n")
    (book / "intro.md").write_text("# Intro\n\nA tiny book.\n")
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Page\n\nThe answer is below."),
            nbformat.v4.new_code_cell("print(6 * 7)"),
            # a value of this run pasted into the prose, and a fixed figure marked as such
            nbformat.v4.new_code_cell(
                "from kvlib.glue import glue\n\nglue(ratio=1.23456, verdict='holds', verdict_ja='成立')"
            ),
            nbformat.v4.new_markdown_cell(GLUED_ENGLISH),
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, book / "page.ipynb")  # no outputs: only an execution can show 42
    catalogues = i18n.catalogue_dir(LANGUAGE, book)
    _write_po(
        catalogues / "page.po",
        {"Page": "ページ", "The answer is below.": "答えは下にあります。", GLUED_ENGLISH: GLUED_JAPANESE},
    )
    _write_po(catalogues / "intro.po", {"Intro": "はじめに", "A tiny book.": "小さな本です。"})
    _write_po(catalogues / f"{i18n.CONFIG_CATALOGUE}.po", {"A tiny book": "小さな本"})

    english = _jupyter_book(book)
    assert english.returncode == 0, english.stdout[-3000:] + english.stderr[-3000:]
    ja_config = book / "_build" / "ja" / "_config.yml"
    i18n.edition_config(LANGUAGE, ja_config, root=book)
    japanese = _jupyter_book(
        book,
        "--config",
        ja_config,
        "--path-output",
        ja_config.parent,
        **{
            kvbook_sphinx.EXECUTION_ENV: "off",
            kvbook_sphinx.OUTPUTS_ENV: str(book / "_build" / "jupyter_execute"),
        },
    )
    assert japanese.returncode == 0, japanese.stdout[-3000:] + japanese.stderr[-3000:]
    return book / "_build" / "html", ja_config.parent / "_build" / "html"


@pytest.mark.slow
def test_the_japanese_build_shows_the_translations_in_a_japanese_page(tiny_editions):
    _, japanese = tiny_editions
    page = (japanese / "page.html").read_text(encoding="utf-8")
    assert '<html lang="ja"' in page
    assert "ページ" in page and "答えは下にあります。" in page and "The answer is below." not in page
    assert "小さな本" in page  # the title, from _config.po
    # Sphinx's and the theme's own labels come out in Japanese: the language was set before Sphinx started
    assert ">検索<" in page or 'title="検索"' in page, "the search button is not labelled in Japanese"
    assert "前へ" in page or "目次" in page
    assert "はじめに" in (japanese / "intro.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_japanese_build_renders_the_english_builds_outputs(tiny_editions):
    english, japanese = tiny_editions
    for html in (english, japanese):
        page = (html / "page.html").read_text(encoding="utf-8")
        assert re.search(r"<pre>(<span></span>)?42\s*</pre>", page), (
            f"{html}: the executed output 42 is not shown"
        )


@pytest.mark.slow
def test_each_edition_links_the_same_page_in_the_other(tiny_editions):
    english, japanese = tiny_editions
    en_page = (english / "page.html").read_text(encoding="utf-8")
    ja_page = (japanese / "page.html").read_text(encoding="utf-8")
    assert '<html lang="en"' in en_page
    assert 'href="ja/page.html" hreflang="ja" lang="ja">日本語</a>' in en_page
    assert 'href="../page.html" hreflang="en" lang="en">English</a>' in ja_page


@pytest.mark.slow
def test_both_editions_paste_this_runs_values_and_show_fixed_figures(tiny_editions):
    english, japanese = tiny_editions
    en_page = (english / "page.html").read_text(encoding="utf-8")
    ja_page = (japanese / "page.html").read_text(encoding="utf-8")
    assert 'The ratio is <span class="pasted-text">1.23</span> and the claim' in en_page
    assert ">holds<" in en_page and "7.5x" in en_page
    # the translated message pastes from the same notebook (a pending reference, kvbook_sphinx)
    assert "比は" in ja_page and "1.23" in ja_page and "成立" in ja_page and "7.5x" in ja_page
    assert "{glue" not in ja_page and "{fixed" not in ja_page
