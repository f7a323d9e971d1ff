"""python -m kvlib size: a table, a JSON object, and one-line errors with exit status 2."""

import json

import pytest

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
        (("Llama-3-8B", "--context", "9000"), "exceeds Llama-3-8B's maximum of 8,192"),
        (("Llama-3-8B", "--context", "10", "--batch", "-2"), "batch must be an integer >= 1"),
        (("Llama-3-8B", "--context", "10", "--kv-dtype", "fp4"), "invalid choice: 'fp4'"),
        (("Llama-3-8B",), "--context"),
        (("no/such/config.json", "--context", "10"), "no config file"),
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
