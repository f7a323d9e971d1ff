"""Fetch the pinned offline JavaScript of the book without node or npm.

    python -m kvbook_sphinx.assets      # run by `make assets` (and so by make book / make test)

``package.json`` names three npm packages (MathJax, RequireJS, the ipywidgets HTML manager)
and ``package-lock.json`` locks their versions and sha512 integrity hashes. The files the
book serves come from those three packages alone (the widget manager's ``dist/`` bundle
already contains its dependencies), so instead of ``npm ci`` this script downloads each
package's tarball from the npm registry, checks it against the lock's integrity hash, and
unpacks it into ``node_modules/<name>/`` exactly where npm would. ``npm ci`` gives the same
result for anyone who prefers it. Set ``NPM_CONFIG_REGISTRY`` to use a mirror.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mathjax", "requirejs", "@jupyter-widgets/html-manager")


def tarball_url(name: str, version: str, registry: str) -> str:
    """The registry's standard tarball address (scoped names drop the scope in the file name)."""
    return f"{registry.rstrip('/')}/{name}/-/{name.rsplit('/', 1)[-1]}-{version}.tgz"


def check_integrity(data: bytes, integrity: str, name: str) -> None:
    """Raise if ``data`` does not hash to the lock file's ``sha512-...`` integrity string."""
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512":
        raise SystemExit(
            f"kvbook: {name}: unsupported integrity algorithm {algorithm!r} in package-lock.json"
        )
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if actual != expected:
        raise SystemExit(
            f"kvbook: {name}: downloaded tarball does not match package-lock.json's integrity hash"
        )


def unpack(data: bytes, target: Path) -> None:
    """Extract an npm tarball (files under ``package/``) into ``target``, refusing unsafe paths."""
    if target.exists():
        shutil.rmtree(target)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) < 2 or ".." in parts or Path(member.name).is_absolute():
                continue
            dest = target.joinpath(*parts[1:])
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(tar.extractfile(member).read())


def fetch(root: Path = ROOT, registry: str | None = None) -> None:
    """Download, verify and unpack each package of :data:`PACKAGES` at its locked version.

    ``registry``: the npm registry (default ``NPM_CONFIG_REGISTRY``, else registry.npmjs.org).
    """
    registry = registry or os.environ.get("NPM_CONFIG_REGISTRY") or "https://registry.npmjs.org"
    lock = json.loads((root / "package-lock.json").read_text())["packages"]
    wanted = json.loads((root / "package.json").read_text())["dependencies"]
    for name in PACKAGES:
        entry = lock[f"node_modules/{name}"]
        if wanted.get(name) != entry["version"]:
            raise SystemExit(
                f"kvbook: {name}: package.json pins {wanted.get(name)}, package-lock.json {entry['version']}"
            )
        url = tarball_url(name, entry["version"], registry)
        print(f"assets: {name} {entry['version']}", file=sys.stderr)
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
        check_integrity(data, entry["integrity"], name)
        unpack(data, root / "node_modules" / name)


if __name__ == "__main__":
    fetch()
