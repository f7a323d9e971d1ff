"""Every notebook in book/ is committed executed, in order, without errors or machine paths,
and every one of them is in the table of contents (so nbval and the build see it)."""

from pathlib import Path

import nbformat
import pytest

from tests.nbtools import hygiene_problems
from tests.toc import ROOT, toc_files, toc_notebooks

BOOK_NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


@pytest.mark.parametrize("path", BOOK_NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean(path):
    assert hygiene_problems(path) == []


def test_every_book_notebook_is_in_the_toc():
    assert BOOK_NOTEBOOKS, "the book has no notebooks"
    assert sorted(toc_notebooks()) == BOOK_NOTEBOOKS


def test_every_toc_entry_exists():
    for entry in toc_files():
        assert any((ROOT / f"{entry}{suffix}").exists() for suffix in (".ipynb", ".md")), f"_toc.yml lists missing {entry}"


# ---- the checker itself must catch each problem


def _notebook(tmp_path: Path, cells) -> Path:
    nb = nbformat.v4.new_notebook(cells=cells)
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def _cell(source, count, outputs=()):
    cell = nbformat.v4.new_code_cell(source)
    cell.execution_count = count
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def test_checker_accepts_a_clean_notebook(tmp_path):
    path = _notebook(tmp_path, [_cell("1", 1, [{"output_type": "execute_result", "data": {"text/plain": "1"}, "metadata": {}, "execution_count": 1}]), _cell("2", 2)])
    assert hygiene_problems(path) == []


def test_checker_catches_unexecuted_cells(tmp_path):
    assert "no stored execution" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("1", 1), _cell("2", None)])))


def test_checker_catches_out_of_order_cells(tmp_path):
    assert "top to bottom" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("1", 2), _cell("2", 1)])))
    assert "top to bottom" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("1", 1), _cell("2", 5)])))


def test_checker_catches_stored_errors(tmp_path):
    error = {"output_type": "error", "ename": "ValueError", "evalue": "boom", "traceback": []}
    assert "ValueError" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("raise", 1, [error])])))


@pytest.mark.parametrize("text", ["/home/alice/kvbook/x.py", "/work/main/book", "/tmp/tmpab12/f", "C:\\Users\\bob\\x", "/usr/lib/python3/site-packages/torch"])
def test_checker_catches_machine_paths(tmp_path, text):
    stream = {"output_type": "stream", "name": "stdout", "text": f"warning in {text}\n"}
    assert "local path" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("print()", 1, [stream])])))
