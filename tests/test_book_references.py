"""What the book's prose points at exists: every ``literalinclude`` names a file that exists
and, with ``:pyobject:``, an object that file defines (the ``-W`` build would fail on a dangling
one; this test says so in seconds, before the notebooks run); every ``kvlib/...`` path and every
dotted ``kvlib.x.y`` name in the prose of the chapters, the pages and the README resolves; every
``{cite}`` key is an entry of ``book/references.bib``."""

import ast
import importlib
import re

import nbformat
import pytest

from tests.toc import ROOT

INCLUDE = re.compile(
    r"```\{literalinclude\}\s+(\S+)\s*\n((?:[ \t]*:[\w-]+:.*\n)*)"
)  # options may be indented
PAGES = sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md"))
PROSE = [*PAGES, ROOT / "README.md"]
PATH = re.compile(r"(?<![\w/.])kvlib/[\w/.-]*[\w/]")  # kvlib/paged/block_pool.py, kvlib/sizing/configs/
DOTTED = re.compile(r"(?<![\w/.])kvlib(?:\.[A-Za-z_]\w*)+")  # kvlib.paged.block_pool.BlockPool.allocate
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([\w.:-]+(?:\s*,\s*[\w.:-]+)*)`")  # {cite:p}`kwon2023vllm,vllmdocs`
BIB_KEY = re.compile(r"^@\w+\{([^,\s]+),", flags=re.M)


def _prose(page) -> str:
    """A page's text without its code cells (code is checked by running it)."""
    if page.suffix == ".ipynb":
        cells = nbformat.read(page, as_version=4).cells
        return "\n".join(c.source for c in cells if c.cell_type == "markdown")
    return page.read_text(encoding="utf-8")


def _resolves(dotted: str) -> bool:
    """Import the longest module prefix of ``dotted``, then look up the rest as attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _includes(page):
    text = _prose(page)
    for match in INCLUDE.finditer(text + "\n"):
        options = dict(re.findall(r":([\w-]+):\s*(.*)", match.group(2)))
        yield match.group(1), options


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
    for target, options in _includes(page):
        path = (page.parent / target).resolve()
        assert path.is_file(), f"{page.name} includes {target}, which does not exist"
        pyobject = options.get("pyobject")
        for option in ("start-after", "end-before"):  # Sphinx fails on a pattern the file lacks
            pattern = options.get(option, "").strip()
            assert pattern in path.read_text(encoding="utf-8"), (
                f"{page.name}: {target} lacks {option} {pattern!r}"
            )
        if pyobject:
            assert _defines(path, pyobject), (
                f"{page.name} includes {pyobject} from {target}, which does not define it"
            )


def test_the_checker_sees_the_includes():
    found = [(target, options.get("pyobject")) for page in PAGES for target, options in _includes(page)]
    assert len(found) > 20 and ("../kvlib/measure/timing.py", "time_it") in found
    assert (
        "../kvlib/chapters/ch05_levers/levers.py",
        "variant_kv_budget",
    ) in found  # an indented include (in a list) counts too


@pytest.mark.parametrize("page", PROSE, ids=lambda p: p.name)
def test_every_kvlib_path_in_the_prose_exists(page):
    missing = sorted({p for p in PATH.findall(_prose(page)) if not (ROOT / p.rstrip(".")).exists()})
    assert not missing, f"{page.name} names {missing}, which do not exist"


@pytest.mark.parametrize("page", PROSE, ids=lambda p: p.name)
def test_every_dotted_kvlib_name_in_the_prose_resolves(page):
    # a trailing ".py"/".json" is a file name, checked above; a sentence may end in a full stop
    names = {n for n in DOTTED.findall(_prose(page)) if not n.endswith((".py", ".js", ".json"))}
    dangling = sorted(n for n in names if not _resolves(n))
    assert not dangling, f"{page.name} names {dangling}, which kvlib does not have"


def test_the_reference_checker_can_fail():
    assert _resolves("kvlib.paged.block_pool.BlockPool") and _resolves("kvlib.measure.timing.time_it")
    assert not _resolves("kvlib.paged_attention.PagedKVCache") and not _resolves("kvlib.measure.no_such_name")
    assert PATH.findall("see kvlib/sizing/configs/ and `kvlib/paged/kernels.py`.") == [
        "kvlib/sizing/configs/",
        "kvlib/paged/kernels.py",
    ]


def _cited(text: str) -> set[str]:
    return {key.strip() for keys in CITE.findall(text) for key in keys.split(",")}


def test_every_cited_key_is_in_the_bibliography():
    entries = set(BIB_KEY.findall((ROOT / "book" / "references.bib").read_text(encoding="utf-8")))
    assert {"kvarticle", "kvarticle_attention", "kvarticle_jamba"} <= entries  # the article, its companions
    missing = {page.name: sorted(_cited(_prose(page)) - entries) for page in PAGES}
    missing = {name: keys for name, keys in missing.items() if keys}
    assert not missing, f"cited but not in book/references.bib: {missing}"


def test_the_citation_checker_can_fail():
    # a role named in inline code (`{cite:p}`, `{doc}`) is not a citation
    assert _cited("as {cite:p}`kwon2023vllm, vllmdocs` and {cite:t}`ainslie2023gqa` show, {cite}`x`") == {
        "kwon2023vllm",
        "vllmdocs",
        "ainslie2023gqa",
        "x",
    }
    assert _cited("roles (`{cite:p}`, `{doc}`) stay as they are") == set()
    assert BIB_KEY.findall("@misc{kvarticle,\n  title = {a}\n}\n@inproceedings{kwon2023vllm,\n") == [
        "kvarticle",
        "kwon2023vllm",
    ]
