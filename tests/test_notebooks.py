"""Every notebook in book/ is committed executed, in order, without errors or machine paths,
and every one of them is in the table of contents (so nbval and the build see it)."""

from pathlib import Path

import nbformat
import pytest

from tests.nbtools import hygiene_problems, unclassified_assertions
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
        assert any((ROOT / f"{entry}{suffix}").exists() for suffix in (".ipynb", ".md")), (
            f"_toc.yml lists missing {entry}"
        )


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
    path = _notebook(
        tmp_path,
        [
            _cell(
                "1",
                1,
                [
                    {
                        "output_type": "execute_result",
                        "data": {"text/plain": "1"},
                        "metadata": {},
                        "execution_count": 1,
                    }
                ],
            ),
            _cell("2", 2),
        ],
    )
    assert hygiene_problems(path) == []


def test_checker_catches_unexecuted_cells(tmp_path):
    assert "no stored execution" in " ".join(
        hygiene_problems(_notebook(tmp_path, [_cell("1", 1), _cell("2", None)]))
    )


def test_checker_catches_out_of_order_cells(tmp_path):
    assert "top to bottom" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("1", 2), _cell("2", 1)])))
    assert "top to bottom" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("1", 1), _cell("2", 5)])))


def test_checker_catches_stored_errors(tmp_path):
    error = {"output_type": "error", "ename": "ValueError", "evalue": "boom", "traceback": []}
    assert "ValueError" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("raise", 1, [error])])))


def test_checker_catches_stderr_output(tmp_path):
    # make test's build renders the stored outputs, so a stored warning must fail here instead
    warning = {"output_type": "stream", "name": "stderr", "text": "UserWarning: slow path\n"}
    problems = hygiene_problems(_notebook(tmp_path, [_cell("import warnings", 1, [warning])]))
    assert problems == ["code cell 0 writes to stderr: 'UserWarning: slow path'"]


@pytest.mark.parametrize(
    "text",
    [
        "/home/alice/kvbook/x.py",
        "/work/main/book",
        "/tmp/tmpab12/f",
        "C:\\Users\\bob\\x",
        "/usr/lib/python3/site-packages/torch",
    ],
)
def test_checker_catches_machine_paths(tmp_path, text):
    stream = {"output_type": "stream", "name": "stdout", "text": f"warning in {text}\n"}
    assert "local path" in " ".join(hygiene_problems(_notebook(tmp_path, [_cell("print()", 1, [stream])])))


# ---- every assertion says what kind of claim it is


@pytest.mark.parametrize(
    "source",
    [
        "assert x == 3  # [exact] three blocks",
        "# [exact]\nassert x == 3",
        "# [guaranteed] reading 4x the bytes from DRAM takes 4x the time, give or take noise\n"
        "assert 2 < r < 8",
        "# [sanity] catches a probe that returns zero\n# (second line of the comment)\nassert r > 0",
        "# [sanity] a seeded draw within three standard errors of the paper's mean\nassert e < 0.03",
        "for i in range(3):\n    # [exact] one per step\n    assert i < 3",
        "%time x = 1\n# [exact] a magic line is skipped\nassert x == 1",
        "y = 1\n\nprint('no assertion here')",
    ],
)
def test_classified_assertions_pass(source):
    assert unclassified_assertions(source) == []


@pytest.mark.parametrize(
    "source, problem",
    [
        ("assert x == 3", "has no [exact]"),
        ("assert r < 8  # a wide margin", "has no [exact]"),
        ("# [guaranteed] it holds\nassert r < 8", "without its argument"),
        ("# [sanity]\nassert r > 0", "without its argument"),
        ("# [exact] covers the first only\nassert a == 1\nassert b == 2", "line 3"),
        ("# [exact] a blank line breaks the block\n\nassert a == 1", "has no"),
        ("if ok:\n    assert (\n        a == 1\n    )", "line 2"),
        ("# [exact] the mean is within 3% of the paper's (three sigma)\nassert e < 0.03", "tolerance"),
        ("# [exact] holds up to noise\nassert r > 1", "names a tolerance ('noise')"),
        ("assert abs(r - 2) < 0.1  # [exact] 2, give or take a margin", "tolerance"),
    ],
)
def test_unclassified_assertions_are_caught(source, problem):
    found = unclassified_assertions(source)
    assert len(found) == 1 and problem in found[0], found


def test_hygiene_reports_an_unclassified_assertion(tmp_path):
    path = _notebook(tmp_path, [_cell("assert 1 + 1 == 2", 1)])
    assert "has no [exact], [guaranteed] or [sanity] tag" in " ".join(hygiene_problems(path))
