"""requirements.txt is the one list of pins; environment.yml (conda, Binder) must agree with it."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;#]+)$")


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = PIN.match(line)
        assert match, f"not an exact pin (name==version): {line!r}"
        pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def requirement_pins() -> dict[str, str]:
    return _pins((ROOT / "requirements.txt").read_text().splitlines())


def environment_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    return _pins(pip_sections[0])


def test_every_requirement_is_pinned_exactly():
    pins = requirement_pins()
    for name in (
        "torch",
        "jupyter-book",
        "nbval",
        "numpy",
        "matplotlib",
        "ipywidgets",
        "pytest",
        "ipykernel",
    ):
        assert name in pins, f"{name} is missing from requirements.txt"
    assert pins["torch"] == "2.13.0"
    assert pins["jupyter-book"].startswith("1."), "the book is built with Jupyter Book 1.x"
    assert pins["nbval"].startswith("0.11")


def test_environment_yml_installs_the_same_pins():
    req, env = requirement_pins(), environment_pins()
    assert set(env) == set(req), (
        f"only in requirements.txt: {set(req) - set(env)}; only in environment.yml: {set(env) - set(req)}"
    )
    drift = {name: (req[name], env[name]) for name in req if req[name] != env[name]}
    assert not drift, f"versions differ (requirements.txt, environment.yml): {drift}"


def test_environment_python_is_supported():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert python, "environment.yml must pin python"
    minor = int(re.search(r"3\.(\d+)", python[0]).group(1))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10,<3.13"
    assert 10 <= minor <= 12


def test_pin_parser_rejects_ranges():
    import pytest

    with pytest.raises(AssertionError):
        _pins(["torch>=2.0"])
