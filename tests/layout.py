"""The import graph of kvlib, read from its source (tests/test_layout.py checks it)."""

import ast
from pathlib import Path

KVLIB = Path(__file__).resolve().parent.parent / "kvlib"


def module_name(path: Path) -> str:
    """kvlib/paged/block_pool.py -> kvlib.paged.block_pool; a package's __init__.py -> the package."""
    parts = path.relative_to(KVLIB.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of kvlib by dotted name."""
    return {module_name(p): p for p in sorted(KVLIB.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The kvlib modules one file imports, anywhere in it (lazy and type-only imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in known and n.startswith("kvlib")}
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the kvlib modules it imports (a package counts as its __init__)."""
    mods = modules()
    return {name: imports_of(path, set(mods)) - {name} for name, path in mods.items()}


def package_of(module: str) -> str:
    """The top-level room a module lives in: kvlib.paged.kernels -> paged, kvlib.cli -> cli."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kvlib"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None
