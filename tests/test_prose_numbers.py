"""The prose cannot drift from the outputs: every number it states about a run is pasted (glue).

- every page of both editions (the notebooks' Markdown cells, the Markdown pages, the Japanese
  catalogues' translations): no number that is neither glued nor marked ``{fixed}`` (tests/prose.py
  says what is read and what is not);
- every key the prose pastes is glued by the page's notebook, as committed (executed), and every
  glued key is pasted somewhere (a value glued and never shown is a leftover);
- the rule itself: it fails on a sentence with a typed result, and passes the same sentence glued.
"""

from __future__ import annotations

import functools
from pathlib import Path

import nbformat
import pytest
from babel.messages.pofile import read_po

from kvbook_sphinx import i18n
from tests.prose import added_numbers, pasted_keys, typed_numbers
from tests.toc import ROOT, toc_files

PAGES = [
    ROOT / f"{page}{suffix}"
    for page in toc_files()
    for suffix in (".ipynb", ".md")
    if (ROOT / f"{page}{suffix}").is_file()
]
NOTEBOOKS = [page for page in PAGES if page.suffix == ".ipynb"]
CATALOGUES = i18n.catalogue_dir("ja")


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _prose(path: Path) -> list[str]:
    """The Markdown of a page: a notebook's Markdown cells, or a .md page's text."""
    if path.suffix == ".ipynb":
        return [
            cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "markdown"
        ]
    return [path.read_text(encoding="utf-8")]


def _messages(path: Path) -> list[tuple[str, str]]:
    """A page's Japanese messages, (English, translation), translated ones only."""
    po = CATALOGUES / path.relative_to(ROOT).with_suffix(".po")
    if not po.is_file():
        return []
    with po.open("rb") as handle:
        catalogue = read_po(handle, locale="ja")
    return [(m.id, m.string) for m in catalogue if m.id and m.string and not m.fuzzy]


def _translations(path: Path) -> list[str]:
    return [translation for _, translation in _messages(path)]


@functools.cache
def glued_keys(path: Path) -> frozenset[str]:
    """The keys a committed notebook's outputs glue (myst-nb's hidden glue outputs)."""
    keys = set()
    for cell in nbformat.read(path, as_version=4).cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                keys.add(name)
    return frozenset(keys)


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_the_english_prose_types_no_result(path):
    typed = [number for text in _prose(path) for number in typed_numbers(text)]
    assert typed == [], (
        f"{_page_id(path)}: numbers neither glued ({{glue:text}}`key:.2f`) nor marked as fixed "
        f"({{fixed}}`...`): "
        + "; ".join(typed[:40])
        + (f"; and {len(typed) - 40} more" if len(typed) > 40 else "")
    )


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_the_japanese_prose_types_no_result(path):
    """A translation writes digits for the English's number words ("three" -> 3), and nothing more."""
    added = {
        english[:60]: numbers
        for english, translation in _messages(path)
        if (numbers := added_numbers(english, translation))
    }
    assert added == {}, f"{_page_id(path)} (ja): numbers the English neither has nor pastes: {added}"


def _pasted(path: Path) -> list[tuple[str, str]]:
    return [pair for text in _prose(path) + _translations(path) for pair in pasted_keys(text)]


def _target(page: Path, document: str) -> Path:
    """The notebook a glue role pastes from: the page's own, or ``document`` relative to it."""
    if not document:
        return page
    return (ROOT / document.lstrip("/")) if document.startswith("/") else (page.parent / document).resolve()


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_every_pasted_key_is_glued_by_its_notebook(path):
    missing = []
    for document, key in _pasted(path):
        notebook = _target(path, document)
        if notebook.suffix != ".ipynb" or not notebook.is_file():
            missing.append(f"{document}::{key} (no such notebook)")
        elif key not in glued_keys(notebook):
            missing.append(f"{key} (not glued by {notebook.relative_to(ROOT).as_posix()})")
    assert missing == [], f"{_page_id(path)} pastes keys its notebook does not glue: {missing}"


def test_every_glued_key_is_pasted():
    pasted = {(_target(page, document), key) for page in PAGES for document, key in _pasted(page)}
    unused = [
        f"{notebook.relative_to(ROOT).as_posix()}: {key}"
        for notebook in NOTEBOOKS
        for key in sorted(glued_keys(notebook))
        if (notebook, key) not in pasted
    ]
    assert unused == [], f"glued but never pasted (remove them, or say them in the prose): {unused}"


# ---- the rule itself


def test_a_typed_result_fails_and_the_same_result_glued_passes():
    typed = "Paging sustains 1.95 times the oracle's rate, up from 1.7x before."
    assert len(typed_numbers(typed)) == 2
    glued = (
        "Paging sustains {glue:text}`ratio:.2f` times the oracle's rate, up from {glue:text}`before:.1f`x."
    )
    assert typed_numbers(glued) == []


def test_fixed_figures_structure_and_names_are_not_results():
    text = (
        "An A100 40GB reads {fixed}`1,555 GB/s` {cite:p}`nvidia2020a100`; see chapter 4, Exercise 4.6 "
        "and the paper's Figure 13a or Section 6.1. OPT-13B, GQA-4, Llama-3-8B and fp16 are names; "
        "a 16-bit type; `block_size = 16` is code; [link](04_serving.ipynb#x-2); $2 \\times 40 \\times 5120$."
    )
    assert typed_numbers(text) == []


def test_list_markers_and_numbered_headings_are_structure():
    found = typed_numbers("## 3. Sizing the cache\n\n1. **How much**\n2. **How big**, 4 bytes")
    assert len(found) == 1 and found[0].startswith("'4' in")


def test_numbers_in_prose_directives_and_tables_are_read():
    assert typed_numbers(":::{note}\nIt took 3.6 ms.\n:::") != []
    assert typed_numbers(":::{dropdown} Why 3.6 times?\nBecause.\n:::") != []  # a title is prose
    assert typed_numbers("| policy | share |\n|---|---|\n| max | 20.4% |") != []
    assert typed_numbers("```{glossary}\nblock\n  It holds 16 tokens.\n```") != []
    assert typed_numbers("```python\nx = 16\n```") == []


def test_a_decimal_in_math_is_refused_and_a_japanese_typed_number_too():
    assert typed_numbers("$1 - 1054 / (4 \\times 2048) = 0.871$") != []
    assert typed_numbers("$2 \\times L \\times H_{kv}$") == []
    assert typed_numbers("第4章の演習 4.6 を見てください。第 4、5、8 章も。") == []


def test_a_translation_may_write_digits_for_number_words_but_adds_no_result():
    english = "Three tools, twice as fast, in chapter 2: {glue:text}`ratio:.2f` times."
    assert added_numbers(english, "3 つの道具で 2 倍速く、第 2 章では {glue:text}`ratio:.2f` 倍です。") == []
    assert added_numbers(english, "3 つの道具で 2 倍速く、第 2 章では約 1.95 倍です。") == ["1.95"]
    assert added_numbers("Paging sustains more.", "ページングはオラクルの約2倍を処理します。") == ["2"]


def test_pasted_keys_name_their_document():
    text = "{glue:text}`a:.2f`, {glue:text}`b`, {glue:text}`04_serving.ipynb::c:.1%` and {glue}`d`"
    assert pasted_keys(text) == [("", "a"), ("", "b"), ("04_serving.ipynb", "c"), ("", "d")]
    assert pasted_keys("a `{glue:text}` role written about in code, and `x`") == []
