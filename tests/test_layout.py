"""The floor plan of kvlib: concept packages, the chapters apart from the library, imports pointing
one way, files split by concept within a budget, one name for each idea (checked on the source)."""

import ast

import pytest

from tests.layout import KVLIB, find_cycle, import_graph, modules, package_of

PACKAGES = (
    "measure",
    "kernels",
    "quant",
    "model",
    "train",
    "cache",
    "quality",
    "sizing",
    "paged",
    "serving",
    "plotting",
    "exercises",
    "chapters",
    "cli",
)
# Files are split by concept, not to fit a count; past this many lines a file is a smell to look at.
SMELL_LINES = 600
# The whole house, in lines of Python (README: "Layout"): the library's concepts and the chapters'
# experiments and exercises, each with room to grow; a budget is raised on purpose, not by drift.
LIBRARY_BUDGET_LINES = 18_000  # kvlib/ without kvlib/chapters/ (17,508 with chapter 11's radix tree)
CHAPTERS_BUDGET_LINES = 12_500  # kvlib/chapters/ (11,229 with chapters 9, 10 and 12)
# Names every module of a kind defines on purpose: the CLI calls each bench module's bench() and
# each command module's add_parser() and run(), and kvlib.chapters.exercises reads each chapter's
# EXERCISES, WRONG_ANSWERS and FIRST_HINTS.
PROTOCOL_NAMES = {"bench", "add_parser", "run", "EXERCISES", "WRONG_ANSWERS", "FIRST_HINTS"}


def test_find_cycle_finds_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_modules():
    """Lazy imports inside functions and type-only imports count too."""
    assert find_cycle(import_graph()) is None


def test_no_import_cycle_between_packages():
    """Data flows one way: if paged imports from cache, nothing in cache imports from paged."""
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        room = package_of(module)
        graph.setdefault(room, set()).update(
            package_of(m) for m in imported if package_of(m) not in (room, "kvlib")
        )
    assert find_cycle(graph) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_says_what_it_holds(package):
    init = KVLIB / package / "__init__.py"
    assert init.exists(), f"kvlib/{package}/ is not a package"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and "chapter" in doc.lower(), (
        f"kvlib/{package}/__init__.py must say what it holds and which chapter uses it"
    )


def test_no_module_past_the_smell_alarm():
    long = {
        name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > SMELL_LINES
    }
    assert not long, long


def _lines(paths) -> int:
    return sum(len(path.read_text().splitlines()) for path in paths)


def test_the_library_and_the_chapters_keep_their_budgets():
    paths = modules().values()
    chapters = [p for p in paths if "chapters" in p.relative_to(KVLIB).parts]
    library = [p for p in paths if p not in chapters]
    assert _lines(library) <= LIBRARY_BUDGET_LINES, _lines(library)
    assert _lines(chapters) <= CHAPTERS_BUDGET_LINES, _lines(chapters)


def test_nothing_in_the_library_imports_a_chapter():
    """The chapters use the library; the library knows no chapter. Two rooms sit above the chapters:
    plotting, which draws what they compute, and the CLI, which runs their bench sections."""
    upward = {
        module: sorted(m for m in imported if package_of(m) == "chapters")
        for module, imported in import_graph().items()
        if package_of(module) not in ("chapters", "cli", "plotting")
    }
    assert {m: i for m, i in upward.items() if i} == {}


def test_only_plotting_imports_matplotlib():
    importers = [
        name
        for name, path in modules().items()
        if not name.startswith("kvlib.plotting")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            m.split(".")[0] == "matplotlib"
            for m in [getattr(node, "module", None) or ""] + [a.name for a in node.names]
        )
    ]
    assert not importers, importers


def test_every_public_name_is_defined_once():
    """``git grep "def name"`` finds one place (package __init__ files only re-export)."""
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        if path.name == "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for n in names:
                if not n.startswith("_") and n not in PROTOCOL_NAMES:
                    where.setdefault(n, []).append(name)
    twice = {n: places for n, places in where.items() if len(places) > 1}
    assert not twice, twice


def test_package_init_exports_resolve():
    import importlib

    for package in PACKAGES:
        mod = importlib.import_module(f"kvlib.{package}")
        for name in getattr(mod, "__all__", ()):
            assert hasattr(mod, name), f"kvlib.{package}.__all__ names {name}, which it lacks"
