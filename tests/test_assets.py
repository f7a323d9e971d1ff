"""kvbook_sphinx.assets fetches the pinned JavaScript without npm; its safety checks must hold."""

import base64
import hashlib
import io
import json
import tarfile

import pytest

from kvbook_sphinx.assets import PACKAGES, ROOT, check_integrity, tarball_url, unpack


def _tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_tarball_urls_follow_the_registry_layout():
    assert (
        tarball_url("mathjax", "3.2.2", "https://r.example/")
        == "https://r.example/mathjax/-/mathjax-3.2.2.tgz"
    )
    assert tarball_url("@jupyter-widgets/html-manager", "1.0.15", "https://r.example") == (
        "https://r.example/@jupyter-widgets/html-manager/-/html-manager-1.0.15.tgz"
    )


def test_integrity_must_match():
    data = b"some tarball"
    good = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    check_integrity(data, good, "pkg")
    with pytest.raises(SystemExit, match="integrity"):
        check_integrity(data + b"!", good, "pkg")
    with pytest.raises(SystemExit, match="algorithm"):
        check_integrity(data, "sha1-abc", "pkg")


def test_unpack_strips_package_prefix_and_refuses_escapes(tmp_path):
    unpack(
        _tarball({"package/dist/a.js": b"a", "package/../../evil.js": b"x", "package/b/c.txt": b"c"}),
        tmp_path / "pkg",
    )
    assert (tmp_path / "pkg" / "dist" / "a.js").read_bytes() == b"a"
    assert (tmp_path / "pkg" / "b" / "c.txt").read_bytes() == b"c"
    assert not any(p.name == "evil.js" for p in tmp_path.rglob("*"))


def test_every_package_is_pinned_and_locked_alike():
    wanted = json.loads((ROOT / "package.json").read_text())["dependencies"]
    lock = json.loads((ROOT / "package-lock.json").read_text())["packages"]
    assert set(wanted) == set(PACKAGES)
    for name in PACKAGES:
        assert lock[f"node_modules/{name}"]["version"] == wanted[name]
        assert lock[f"node_modules/{name}"]["integrity"].startswith("sha512-")
