"""python -m kvlib size: a table, a JSON object, and one-line errors with exit status 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlib.cli import main
from tests.test_cli import kvlib


def test_size_table_and_json():
    result = kvlib("size", "Llama-2-7B", "--context", "4096")
    assert result.returncode == 0, result.stderr
    assert "2,147,483,648 B" in result.stdout and result.stdout.startswith("model")
    data = json.loads(kvlib("size", "Llama-3-8B", "--context", "8192", "--batch", "2", "--json").stdout)
    assert data["total_bytes"] == 2 * 2**30 and data["bytes_per_token"] == 131_072
    assert (data["num_layers"], data["num_kv_heads"], data["head_dim"]) == (32, 8, 128)
    assert isinstance(data["total_bytes"], int)


def test_size_reads_a_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "hidden_size": 256,
                "max_position_embeddings": 100,
            }
        )
    )
    data = json.loads(kvlib("size", str(path), "--context", "100", "--kv-dtype", "int4", "--json").stdout)
    assert (
        data["total_bytes"] == 2 * 2 * 1 * (32 + 2 * 4) * 100
    )  # layers x K,V x heads x int4 vector x tokens


@pytest.mark.parametrize(
    "args, message",
    [
        (("Lama-3-8B", "--context", "10"), "did you mean Llama-3-8B"),
        (("Llama-3-8B", "--context", "0"), "context must be an integer >= 1"),
        (("Llama-3-8B", "--context", "many"), "invalid int value"),
        (("Llama-3-8B", "--context", "10", "--batch", "-2"), "batch must be an integer >= 1"),
        (("Llama-3-8B", "--context", "10", "--kv-dtype", "fp4"), "invalid choice: 'fp4'"),
        (("Llama-3-8B",), "--context"),
        (("no/such/config.json", "--context", "10"), "no config file"),
        (("config.JSON", "--context", "10"), "no config file at config.JSON (no such file or directory)"),
        (("Llama-3-70B", "--context", "10", "--tensor-parallel-size", "3"), "must be divisible by tensor"),
        (("Llama-3-70B", "--context", "10", "--pipeline-parallel-size", "81"), "exceeds the 80 layers"),
        (
            ("Llama-3-70B", "--context", "10", "--tensor-parallel-size", "0"),
            "--tensor-parallel-size must be an integer from 1 to 1,000,000,000,000, not 0",
        ),
        (("Llama-3-8B", "--context", "9" * 5000), "invalid int value"),
    ],
)
def test_size_errors_are_one_line_and_exit_2(args, message):
    result = kvlib("size", *args)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvlib: error:") and message in lines[0], result.stderr


def test_size_rejects_a_malformed_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 250}))
    result = kvlib("size", str(path), "--context", "10")
    assert result.returncode == 2 and "hidden_size (250) is not divisible" in result.stderr


def test_beyond_the_maximum_context_is_sized_with_a_warning():
    result = kvlib("size", "Llama-3-8B", "--context", "9000", "--json")
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["exceeds_max_context"] is True and data["total_bytes"] == 9000 * 131_072
    assert result.stderr.startswith("kvlib: warning: context 9,000 exceeds Llama-3-8B's maximum of 8,192")
    inside = json.loads(kvlib("size", "Llama-3-8B", "--context", "8192", "--json").stdout)
    assert inside["exceeds_max_context"] is False


def test_tensor_and_pipeline_parallel_per_gpu(capsys):
    argv = ["size", "Llama-3-70B", "--context", "8192", "--json"]
    assert main([*argv, "--tensor-parallel-size", "16", "--pipeline-parallel-size", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    # TP 16 > 8 KV heads: one head per GPU; PP 3 on 80 layers: 26, 27, 27
    assert data["kv_heads_per_gpu"] == 1 and data["per_gpu_bytes"] == 27 * 8192 * 2 * 128 * 2
    assert data["total_bytes"] == 80 * 8192 * 2 * 8 * 128 * 2
    assert main(["size", "Llama-3-70B", "--context", "8192", "--tensor-parallel-size", "8"]) == 0
    assert "per GPU" in capsys.readouterr().out


def one_error_line(result, message):
    assert result.returncode == 2 and result.stdout == "", result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvlib: error:") and message in lines[0], result.stderr


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"num_hidden_layers": ' + "9" * 5000 + "}", "is not valid JSON (Exceeds the limit (4300 digits)"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("{not json", "is not valid JSON"),
        (b"\xff\xfe{}", "is not UTF-8 text"),
        ("[1, 2]", "must hold a JSON object, not list"),
        (
            json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8,
                        "layer_types": ["mamba", "mamba"]}),
            "has no attention layer",
        ),
        (json.dumps({"num_hidden_layers": 10**12, "num_attention_heads": 2, "hidden_size": 8}), ""),
    ],
)  # fmt: skip
def test_hostile_config_files(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = kvlib("size", str(path), "--context", "10", timeout=30)
    if message:
        one_error_line(result, message)
    else:  # 10**12 layers: answered at once, 2 x 10**12 x 2 heads x 4 values x 10 tokens x 2 bytes
        assert result.returncode == 0 and "320,000,000,000,000 B" in result.stdout, result.stderr


def test_a_directory_is_read_through_its_config_json(tmp_path):
    one_error_line(kvlib("size", str(tmp_path), "--context", "10"), "is a directory with no config.json")
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                     "hidden_size": 256}))  # fmt: skip
    data = json.loads(kvlib("size", str(tmp_path), "--context", "10", "--json").stdout)
    assert data["total_bytes"] == 2 * 2 * 4 * 64 * 10 * 2


def test_an_unreadable_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "config.json"
    path.write_text("{}")

    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", refuse)
    assert main(["size", str(path), "--context", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlib: error: cannot read") and "Permission denied" in err and err.count("\n") == 1


def test_piping_into_head_ends_quietly():
    command = f"{sys.executable} -m kvlib size Llama-3-8B --context 10 --json | head -c 1"
    result = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    assert result.stdout == "{" and result.stderr == ""
    big = f"for i in 1 2 3; do {sys.executable} -m kvlib size Llama-3-8B --context 10; done | head -c 1"
    result = subprocess.run(big, shell=True, capture_output=True, text=True, timeout=60, env=os.environ)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


class ClosedPipe:
    """A stdout whose reader went away: every write raises BrokenPipeError, as a pipe into head does."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_is_not_an_error(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["size", "Llama-3-8B", "--context", "10", "--json"]) == 0
    assert capsys.readouterr().err == ""


FIXTURES = Path(__file__).parent / "sizing" / "fixtures"


def test_encoder_and_image_tokens_set_the_cross_attention_length(capsys):
    t5 = str(FIXTURES / "google-t5__t5-base.json")
    assert main(["size", t5, "--context", "256", "--encoder-tokens", "100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # 12 decoder layers x 2 (K, V) x 12 heads x 64 x 2 bytes = 36,864 B per token: 256 generated, 100 encoded
    assert data["total_bytes"] == 12 * 2 * 12 * 64 * 2 * (256 + 100)
    vision = str(FIXTURES / "meta-llama__Llama-3.2-11B-Vision-Instruct.json")
    assert main(["size", vision, "--context", "1024", "--image-tokens", "0", "--json"]) == 0
    without_images = json.loads(capsys.readouterr().out)["total_bytes"]
    assert main(["size", vision, "--context", "1024", "--image-tokens", "1601", "--json"]) == 0
    one_tile = json.loads(capsys.readouterr().out)["total_bytes"]
    # 8 cross-attention layers (of 40) x 2 x 8 KV heads x 128 x 2 bytes per image token
    assert one_tile - without_images == 8 * 2 * 8 * 128 * 2 * 1601


@pytest.mark.parametrize(
    "args, message",
    [
        (["Llama-3-8B", "--context", "8", "--image-tokens", "10"], "cross_attention_layers"),
        (["Llama-3-8B", "--context", "8", "--encoder-tokens", "10"], "encoder-decoder"),
        (["Whisper-large-v3", "--context", "8", "--encoder-tokens", "0"], "encoder_tokens"),
    ],
)
def test_cross_attention_lengths_where_they_do_not_apply_are_refused(args, message):
    result = kvlib("size", *args)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1


def test_size_and_help_start_without_torch():
    """``size`` is arithmetic: neither it nor ``--help`` imports torch (a torch import costs seconds)."""
    code = (
        "import contextlib, io, sys\n"
        "from kvlib.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['size', 'Llama-3-8B', '--context', '8192']) == 0\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'pandas')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
