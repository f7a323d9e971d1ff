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


def test_capacity_is_a_command_and_prints_what_vllm_would_log():
    result = kvlib("capacity", "Llama-3-8B", "--gpu-memory-gib", "80", "--activation-gib", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # 0.9 x 80 GiB less the estimated weights and 2 GiB of activations, in blocks of 16 tokens x 32 layers
    # x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 2 MiB
    assert report["block_bytes"] == 16 * 32 * 8 * 128 * 2 * 2
    assert report["num_blocks"] == report["available_bytes"] // report["block_bytes"]


@pytest.mark.parametrize(
    "args",
    [
        ("capacity", "Llama-3-8B", "--gpu-memory-gib", "80"),  # no --activation-gib
        ("capacity", "Llama-3-8B", "--gpu-memory-gib", "nan", "--activation-gib", "2"),
        (
            "capacity",
            "Llama-3-8B",
            "--gpu-memory-gib",
            "80",
            "--activation-gib",
            "2",
            "--tensor-parallel-size",
            "3",
        ),
    ],
)
def test_capacity_bad_input_is_one_line_and_exit_2(args):
    result = kvlib(*args)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvlib: error:"), result.stderr
