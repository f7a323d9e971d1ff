"""The test command must fail when the book is broken. These tests break small copies on purpose.

They run the same tools as `make nbval` and `make build-check` (pytest --nbval with our
sanitize file, jupyter-book build -W -n --keep-going with our _config.yml) on tiny notebooks
in a temporary folder, and check that each kind of breakage makes them exit non-zero.
"""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"

pytestmark = pytest.mark.slow  # each test builds a small book or runs nbval (seconds each)


def _write_nb(path: Path, cells) -> Path:
    """cells: (source, stored text output or None) pairs, stored as executed 1..n."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for count, (source, text) in enumerate(cells, start=1):
        cell = nbformat.v4.new_code_cell(source)
        cell.execution_count = count
        if text is not None:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def _nbval(path: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(path.parent),
        "--nbval",
        "--nbval-current-env",
        "--nbval-sanitize-with",
        str(SANITIZE),
        str(path),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=path.parent, timeout=300)


def test_nbval_passes_a_good_notebook_with_volatile_times(tmp_path):
    nb = _write_nb(
        tmp_path / "good.ipynb",
        [
            ("print(6 * 7)", "42\n"),
            ("print('took 0.123 s')", "took 9.999 s\n"),  # sanitized: durations differ
            ("# NBVAL_IGNORE_OUTPUT\nimport random; print(random.random())", "0.5\n"),
        ],
    )
    result = _nbval(nb)
    assert result.returncode == 0, result.stdout


def test_nbval_fails_when_a_cell_raises(tmp_path):
    result = _nbval(
        _write_nb(tmp_path / "raises.ipynb", [("assert 1 + 1 == 3, 'claim does not hold'", None)])
    )
    assert result.returncode != 0
    assert "claim does not hold" in result.stdout


def test_nbval_fails_when_a_deterministic_output_changes(tmp_path):
    result = _nbval(_write_nb(tmp_path / "changed.ipynb", [("print(2 * 1024**3)", "2147483647\n")]))
    assert result.returncode != 0


def _tiny_book(tmp_path: Path, markdown: str, code: str) -> subprocess.CompletedProcess:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(config))
    for bib in config.get("bibtex_bibfiles", []):  # the bibliography the config names must exist
        (tmp_path / bib).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / bib).write_text((ROOT / bib).read_text())
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: page\n")
    (tmp_path / "intro.md").write_text("# Intro\n\nA tiny book.\n")
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell(f"# Page\n\n{markdown}"), nbformat.v4.new_code_cell(code)]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "page.ipynb")
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    return subprocess.run(
        [str(jupyter_book), "build", str(tmp_path), "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    "markdown, code, should_pass",
    [
        ("Fine.", "print(6 * 7)", True),
        ("Fine.", "raise RuntimeError('a cell failed')", False),
        ("See {ref}`no-such-label`.", "print(6 * 7)", False),
        ("Fine.", "import warnings; warnings.warn('a library complains')", False),
    ],
    ids=["clean", "cell-error", "broken-reference", "cell-warning"],
)
def test_book_build_fails_on_errors_and_warnings(tmp_path, markdown, code, should_pass):
    result = _tiny_book(tmp_path, markdown, code)
    assert (result.returncode == 0) == should_pass, result.stdout[-2000:] + result.stderr[-2000:]
