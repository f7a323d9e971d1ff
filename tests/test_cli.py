import json
import subprocess
import sys

import pytest


def kvlib(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kvlib", *args], capture_output=True, text=True, timeout=timeout)


def test_env_prints_the_banner():
    result = kvlib("env")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("CPU ")


def test_env_json_is_one_object():
    report = json.loads(kvlib("env", "--json").stdout)
    assert report["num_cpus"] >= 1 and "torch" in report


def test_bench_json_has_numeric_fields():
    result = kvlib("bench", "--json", "--only", "measure")
    assert result.returncode == 0, result.stderr
    fields = json.loads(result.stdout)
    assert fields["mem_bandwidth_gbps"] > 0
    assert all(isinstance(v, (int, float, bool, dict)) for v in fields.values())


@pytest.mark.parametrize(
    "args",
    [
        ("nonsense",),
        ("bench", "--frobnicate"),
        ("env", "--json", "extra"),
        (),
        ("bench", "--only", "no-such-section"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args):
    result = kvlib(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvlib: error:"), result.stderr
    assert "Traceback" not in result.stderr
