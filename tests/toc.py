"""List the notebooks of the book, in the order of ``_toc.yml``.

``python -m tests.toc`` prints their paths, one per line; ``make nbval`` feeds them to
``pytest --nbval`` so that every notebook in the table of contents is checked.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def toc_files(toc_path: Path = ROOT / "_toc.yml") -> list[str]:
    """Every ``file:`` entry of the table of contents (root first), without suffix."""
    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8"))
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("parts", toc.get("chapters", [])))
    return files


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """The ``.ipynb`` files the table of contents points at."""
    return [root / f"{f}.ipynb" for f in toc_files(root / "_toc.yml") if (root / f"{f}.ipynb").exists()]


if __name__ == "__main__":
    for path in toc_notebooks():
        print(path.relative_to(ROOT))
