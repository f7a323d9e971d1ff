"""Notebook tools for authors and tests.

    python -m tests.nbtools execute book/01_no_cache.ipynb ...   # run top to bottom, store outputs
    python -m tests.nbtools from-py draft.py book/NN_slug.ipynb   # percent-format script -> notebook
    python -m tests.nbtools to-py book/NN_slug.ipynb draft.py     # notebook -> percent-format script
    python -m tests.nbtools check book/                           # hygiene report (exit 1 on problems)

The ``.ipynb`` files in ``book/`` are the source of truth and are committed executed:
nbval only compares cells that have a stored execution. ``hygiene_problems`` is what
``tests/test_notebooks.py`` asserts on.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

# Outputs must not show where the book happened to be executed.
MACHINE_PATH = re.compile(
    r"(/root/|/home/[^/\s]+/|/Users/[^/\s]+/|[A-Za-z]:\\Users\\|/tmp/\S|/work/|/opt/\S|site-packages|dist-packages)"
)
MAX_NOTEBOOK_BYTES = 2_000_000


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def _output_text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    data = output.get("data", {})
    return "".join(data.get(kind, "") for kind in ("text/plain", "text/html", "text/markdown"))


def hygiene_problems(path: Path) -> list[str]:
    """What is wrong with a committed notebook: unexecuted or out-of-order cells,
    stored errors or stderr output (a warning, a traceback), machine paths in outputs,
    assertions without their classification, or too large a file."""
    problems = []
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        problems.append(f"file is {path.stat().st_size / 1e6:.1f} MB, over {MAX_NOTEBOOK_BYTES / 1e6:.0f} MB")
    nb = nbformat.read(path, as_version=4)
    cells = _code_cells(nb)
    counts = [c.execution_count for c in cells]
    missing = [i for i, n in enumerate(counts) if n is None]
    if missing:
        problems.append(f"code cells {missing} have no stored execution (nbval would not check them)")
    elif counts != list(range(1, len(cells) + 1)):
        problems.append(
            f"execution counts {counts} are not 1..{len(cells)}: not run top to bottom in a fresh kernel"
        )
    for i, cell in enumerate(cells):
        for output in cell.get("outputs", []):
            text = _output_text(output)
            if output.get("output_type") == "error":
                problems.append(
                    f"code cell {i} stores an error: {output.get('ename')}: {output.get('evalue', '')[:80]}"
                )
            elif output.get("name") == "stderr":
                # make test's build renders these stored outputs (KVBOOK_NB_EXECUTION=off), so the
                # build's stderr_output: warn no longer sees them: a warning stored here is refused
                problems.append(f"code cell {i} writes to stderr: {text.strip()[:80]!r}")
            match = MACHINE_PATH.search(text)
            if match:
                near = text[max(0, match.start() - 20) : match.end() + 20]
                problems.append(f"code cell {i} output shows a local path near {near!r}")
        problems.extend(f"code cell {i}: {problem}" for problem in unclassified_assertions(cell.source))
        if "solution(" in cell.source and "remove-cell" not in cell.metadata.get("tags", []):
            # an exercise's solution is proven where the reader does not see it
            problems.append(f"code cell {i} shows a solution: tag it remove-cell, or pose a blank instead")
    problems.extend(readability_problems(nb))
    return problems


# Readable chapters: no stretch of prose longer than this many lines without a code cell,
# a figure, a table, an equation or an admonition between; and a key-idea box opening every section.
MAX_PROSE_LINES = 25
UNBOXED_SECTIONS = ("Summary", "Exercises", "On a GPU", "References")
KEY_IDEA = ":::{admonition} Key idea"


def _prose_runs(text: str) -> list[int]:
    """Lengths of the runs of prose lines in a markdown cell: fenced blocks (code, directives,
    admonitions), tables, display math and images break a run."""
    runs, run, fence = [], 0, None
    for line in text.splitlines():
        stripped = line.strip()
        opener = re.match(r"^(`{3,}|:{3,})", stripped)
        if fence:
            if stripped.startswith(fence):
                fence = None
            continue
        if opener:
            runs.append(run)
            run, fence = 0, opener.group(1)
        elif stripped.startswith(("|", "$$", "![", "<img")):
            runs.append(run)
            run = 0
        else:
            run += 1
    return [*runs, run]


def readability_problems(nb) -> list[str]:
    """Prose runs over :data:`MAX_PROSE_LINES` (across consecutive markdown cells) and sections
    (``## ``) whose first cell has no key-idea box."""
    problems, run, start = [], 0, 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            run = 0
            continue
        runs = _prose_runs(cell.source)
        if len(runs) == 1:  # no break inside: the run goes on from the previous cell
            run, start = (run + runs[0], start) if run else (runs[0], i)
        else:
            if run + runs[0] > MAX_PROSE_LINES:
                problems.append(f"markdown cells {start}-{i}: {run + runs[0]} lines of prose without a break")
            problems.extend(
                f"markdown cell {i}: {n} lines of prose without a break"
                for n in runs[1:-1]
                if n > MAX_PROSE_LINES
            )
            run, start = runs[-1], i
        if run > MAX_PROSE_LINES:
            problems.append(f"markdown cells {start}-{i}: {run} lines of prose without a break")
            run = 0
        for heading in re.findall(r"^## (.+)$", cell.source, flags=re.M):
            if (
                not heading.startswith(UNBOXED_SECTIONS)
                and KEY_IDEA not in cell.source.split("## " + heading, 1)[1][:1500]
            ):
                problems.append(f"markdown cell {i}: section {heading[:40]!r} opens without a key-idea box")
    return problems


# Every assertion in a notebook says what kind of claim it checks (the developers' rule):
#   [exact]       a deterministic output (sizes, tokens, block tables, counts);
#   [guaranteed]  a claim physics or arithmetic guarantees, with the argument for its margin;
#   [sanity]      a labelled sanity bound, with the gross failure it catches.
ASSERTION_TAG = re.compile(r"\[(exact|guaranteed|sanity)\]\s*(.*)")
MIN_ARGUMENT_WORDS = {"exact": 0, "guaranteed": 6, "sanity": 3}


# An [exact] claim is arithmetic or a deterministic output, checked as such: an argument that needs a
# tolerance (sampling error, noise, "within 3 points") makes it a [sanity] bound or a regression check.
TOLERANCE_WORDS = re.compile(
    r"\b(?:tolerances?|within|sigmas?|standard errors?|margins?|noise|noisy)\b|σ|±", re.IGNORECASE
)


def _tag_problem(comment: str) -> str | None:
    """None when ``comment`` carries a tag with enough words after it, else what is missing."""
    match = ASSERTION_TAG.search(comment)
    if not match:
        return "has no [exact], [guaranteed] or [sanity] tag"
    kind, argument = match.group(1), match.group(2)
    if len(argument.split()) < MIN_ARGUMENT_WORDS[kind]:
        return f"is tagged [{kind}] without its argument (at least {MIN_ARGUMENT_WORDS[kind]} words)"
    tolerance = TOLERANCE_WORDS.search(argument) if kind == "exact" else None
    if tolerance:
        return (
            f"is tagged [exact] but its argument names a tolerance ({tolerance.group(0)!r}): "
            "an exact claim needs none; tag it [sanity] (say what it catches) or check the exact value"
        )
    return None


def unclassified_assertions(source: str) -> list[str]:
    """Assertions in a code cell whose tag is missing: on the assert's first line or in the
    block of comment lines right above it (a comment block covers the one assert below it)."""
    import ast
    import io
    import tokenize

    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []  # the notebook's own execution reports it
    lines = code.splitlines()
    comments = {
        tok.start[0]: tok.string
        for tok in tokenize.generate_tokens(io.StringIO(code + "\n").readline)
        if tok.type == tokenize.COMMENT
    }
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        block, line = [comments.get(node.lineno, "")], node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            block.insert(0, lines[line - 1].strip())
            line -= 1
        problem = _tag_problem(" ".join(block))
        if problem:
            problems.append(
                f"assert on line {node.lineno} ({lines[node.lineno - 1].strip()[:50]!r}) {problem}"
            )
    return problems


def execute(path: Path, timeout: int = 600) -> None:
    """Run a notebook top to bottom in a fresh kernel (cwd = its folder) and save it."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    nbformat.write(nb, path)


def from_py(script: Path, notebook: Path) -> None:
    """Percent-format script (``# %%`` code, ``# %% [markdown]`` prose) to an unexecuted notebook."""
    import json

    cells, kind, lines, tags = [], None, [], []

    def flush():
        text = "\n".join(lines).strip("\n")
        if kind == "markdown":
            text = "\n".join(re.sub(r"^# ?", "", line) for line in text.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(text))
        elif kind == "code" and text.strip():
            cells.append(nbformat.v4.new_code_cell(text))
        else:
            return
        if tags:
            cells[-1].metadata["tags"] = tags

    for line in script.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
            marked = re.search(r"tags=(\[.*\])", line)
            tags = json.loads(marked.group(1)) if marked else []
        elif kind is not None:
            lines.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, notebook)


def to_py(notebook: Path, script: Path) -> None:
    """Notebook to a percent-format script, for editing in a text editor (cell tags on the markers)."""
    import json

    nb = nbformat.read(notebook, as_version=4)
    parts = []
    for cell in nb.cells:
        tags = cell.metadata.get("tags")
        marker = f" tags={json.dumps(tags)}" if tags else ""  # kept by from-py (remove-cell, ...)
        if cell.cell_type == "markdown":
            parts.append(
                f"# %% [markdown]{marker}\n"
                + "\n".join(("# " + line).rstrip() for line in cell.source.splitlines())
            )
        elif cell.cell_type == "code":
            parts.append(f"# %%{marker}\n" + cell.source)
    script.write_text("\n\n".join(parts) + "\n", encoding="utf-8")


def _main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in {"execute", "from-py", "to-py", "check"}:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], [Path(a) for a in argv[1:]]
    if command == "execute":
        for path in args:
            print(f"executing {path}", file=sys.stderr, flush=True)
            execute(path)
    elif command == "from-py":
        from_py(*args)
    elif command == "to-py":
        to_py(*args)
    else:
        paths = [p for a in args for p in (sorted(a.glob("*.ipynb")) if a.is_dir() else [a])]
        bad = [(p, problem) for p in paths for problem in hygiene_problems(p)]
        for p, problem in bad:
            print(f"{p}: {problem}")
        print(f"{len(paths)} notebooks, {len(bad)} problems")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
