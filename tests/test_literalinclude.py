"""Every ``literalinclude`` in the book names a file that exists and, with ``:pyobject:``, an
object that file defines: the build (``-W``) would fail on a dangling one, this test says so
in seconds, before the notebooks run."""

import ast
import re

import nbformat
import pytest

from tests.toc import ROOT

INCLUDE = re.compile(r"```\{literalinclude\}\s+(\S+)\s*\n((?::[\w-]+:.*\n)*)")
PAGES = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md"))


def _includes(page):
    if page.suffix == ".ipynb":
        text = "\n".join(
            c.source for c in nbformat.read(page, as_version=4).cells if c.cell_type == "markdown"
        )
    else:
        text = page.read_text(encoding="utf-8")
    for match in INCLUDE.finditer(text + "\n"):
        options = dict(re.findall(r":([\w-]+):\s*(.*)", match.group(2)))
        yield match.group(1), options.get("pyobject")


def _defines(path, dotted: str) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    for part in dotted.split("."):
        found = [
            n
            for n in body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.name == part
        ]
        if not found:
            return False
        body = found[0].body
    return True


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_literalinclude_resolves(page):
    for target, pyobject in _includes(page):
        path = (page.parent / target).resolve()
        assert path.is_file(), f"{page.name} includes {target}, which does not exist"
        if pyobject:
            assert _defines(path, pyobject), (
                f"{page.name} includes {pyobject} from {target}, which does not define it"
            )


def test_the_checker_sees_the_includes():
    found = [inc for page in PAGES for inc in _includes(page)]
    assert len(found) > 20 and ("../kvlib/measure.py", "time_it") in found
