"""python -m kvlib env and bench: the hardware banner and its JSON, the LLC override, the bench's
numeric JSON, and one-line errors with exit status 2 for bad input."""

import json
import subprocess
import sys

import pytest


def kvlib(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "kvlib", *args], capture_output=True, text=True, timeout=timeout
    )


def test_env_prints_the_banner():
    result = kvlib("env")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("CPU ")


def test_env_json_is_one_object():
    report = json.loads(kvlib("env", "--json").stdout)
    assert report["num_cpus"] >= 1 and "torch" in report
    assert report["caches"]["llc_bytes"] > 0 and report["num_cores"] >= 1


def test_env_honours_and_checks_the_llc_override(monkeypatch):
    monkeypatch.setenv("KVBOOK_LLC_BYTES", "512MiB")
    assert json.loads(kvlib("env", "--json").stdout)["caches"]["llc_bytes"] == 512 << 20
    monkeypatch.setenv("KVBOOK_LLC_BYTES", "half a gig")
    result = kvlib("env")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "KVBOOK_LLC_BYTES must be a positive size" in result.stderr


@pytest.mark.slow
def test_bench_json_has_numeric_fields():
    result = kvlib("bench", "--json", "--only", "measure")
    assert result.returncode == 0, result.stderr
    fields = json.loads(result.stdout)
    assert fields["mem_bandwidth_gbps"] > 0 and fields["mem_bandwidth_1thread_gbps"] > 0
    assert fields["mem_probe_bytes"] >= 4 * fields["llc_bytes"] or fields["mem_probe_bounded"]
    assert fields["matmul_gflops"] > 0 and fields["matmul_1thread_gflops"] > 0
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
