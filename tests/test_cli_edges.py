"""The command line at its edges: each hostile input is a one-line error with exit status 2,
or an answer, within seconds. ``kvlib.cli.main`` runs in-process (stdout and stderr via capsys),
and one case runs as ``python -m kvlib`` in a subprocess, as a reader types it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from kvlib import KVLibError
from kvlib.cli import main
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.sizing.catalog import catalog_config
from kvlib.train.checkpoint import load_model, save_model, sha256_of
from tests.test_cli import kvlib

FIXTURES = Path(__file__).parent / "sizing" / "fixtures"
CAPACITY = ["--gpu-memory-gib", "80", "--activation-gib", "2", "--weight-gib", "10"]
SECONDS = 5.0  # "within a few seconds": every case here answers in well under one on a shared core

# bigscience/bloom-560m's config.json as published: ALiBi (no position limit), and two keys
# (offset_alibi, skip_bias_add_qkv) whose names look size-relevant but cannot change the cache.
BLOOM = {
    "apply_residual_connection_post_layernorm": False, "architectures": ["BloomForCausalLM"],
    "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True,
    "model_type": "bloom", "n_head": 16, "n_inner": None, "n_layer": 24, "offset_alibi": 100,
    "pad_token_id": 3, "pretraining_tp": 1, "skip_bias_add": True, "skip_bias_add_qkv": False,
    "slow_but_exact": False, "transformers_version": "4.21.0", "unk_token_id": 0, "use_cache": True,
    "vocab_size": 250880,
}  # fmt: skip


def run(capsys, argv: list[str]) -> tuple[int, str, str, float]:
    """(exit status, stdout, stderr, seconds) of ``python -m kvlib argv``, in-process."""
    start = time.perf_counter()
    status = main(argv)
    seconds = time.perf_counter() - start
    captured = capsys.readouterr()
    return status, captured.out, captured.err, seconds


def one_line_refusal(capsys, argv: list[str], *words: str) -> str:
    """Exit 2, nothing on stdout, one stderr line starting 'kvlib: error:' that contains ``words``."""
    status, out, err, seconds = run(capsys, argv)
    lines = err.strip().splitlines()
    assert status == 2 and out == "" and len(lines) == 1, (status, out, err)
    assert lines[0].startswith("kvlib: error: ") and all(w in lines[0] for w in words), lines[0]
    assert len(lines[0]) < 400 and seconds < SECONDS, (len(lines[0]), seconds)
    return lines[0]


def write_config(tmp_path: Path, config: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


# ------------------------------------------------------------ keys that cannot change the cache


@pytest.mark.parametrize(
    "command", [["size", "--context", "2048"], ["capacity", *CAPACITY, "--max-model-len", "2048"]]
)  # ALiBi: no maximum context in the config, so capacity needs --max-model-len
def test_bloom_is_sized_and_verbose_lists_its_ignored_keys(capsys, tmp_path, command):
    """BLOOM-560m: 24 layers x 16 heads (MHA) x head_dim 1024 / 16 = 64, K and V in fp16:
    2 x 16 x 64 x 2 B x 24 = 98,304 B per token. It was refused for skip_bias_add_qkv."""
    path = write_config(tmp_path, BLOOM)
    status, out, err, _ = run(capsys, [command[0], path, *command[1:], "--verbose"])
    assert status == 0, err
    ignored = [line for line in err.splitlines() if line.startswith("kvlib: ignored config keys")]
    assert len(ignored) == 1 and "offset_alibi" in ignored[0] and "skip_bias_add_qkv" in ignored[0]
    if command[0] == "size":
        assert "98,304 B" in out and "24 with a KV cache of 24" in out, out
    status, _, quiet, _ = run(capsys, [command[0], path, *command[1:]])
    assert status == 0 and "ignored" not in quiet  # listed only with --verbose


# ------------------------------------------------------------ parallel sizes


@pytest.mark.parametrize("flag", ["--tensor-parallel-size", "--pipeline-parallel-size"])
@pytest.mark.parametrize("value", ["0", "-3", str(-(10**30))])
@pytest.mark.parametrize(
    "command", [["size", "Llama-3-8B", "--context", "8"], ["capacity", "Llama-3-8B", *CAPACITY]]
)
def test_a_parallel_size_below_one_is_named_by_its_flag(capsys, command, flag, value):
    one_line_refusal(
        capsys, [*command, flag, value], f"{flag} must be an integer from 1 to 1,000,000,000,000, not {value}"
    )


# ------------------------------------------------------------ config.json and model names


@pytest.mark.parametrize("model_type", [["llama"], {"type": "llama"}, [], 3])
@pytest.mark.parametrize("command", [["size", "--context", "8"], ["capacity", *CAPACITY]])
def test_a_model_type_that_is_not_a_string_is_one_line(capsys, tmp_path, command, model_type):
    path = write_config(tmp_path, {**catalog_config("Llama-3-8B"), "model_type": model_type})
    one_line_refusal(capsys, [command[0], path, *command[1:]], "model_type must be a string")


@pytest.mark.parametrize(
    "name", ["x" * 300, "x" * 300 + ".json", "/tmp/" + "y" * 300 + ".json", "a/" * 2000 + "config.json"]
)
@pytest.mark.parametrize("command", [["size", "--context", "8"], ["capacity", *CAPACITY]])
def test_a_very_long_model_name_is_one_short_line(capsys, command, name):
    """A name over 255 characters was an OSError (file name too long) traceback."""
    line = one_line_refusal(capsys, [command[0], name, *command[1:]])
    assert "characters" in line or "too long" in line or "no config file" in line, line


# ------------------------------------------------------------ huge layer patterns: bounded work


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def huge(name: str, where: str | None = None, **changes) -> dict:
    config = fixture(name)
    (config[where] if where else config).update(changes)
    return config


HUGE_PATTERNS = {
    "Gemma-3 sliding_window_pattern 10**12": huge("google__gemma-3-1b-it", sliding_window_pattern=10**12),
    "Jamba attn_layer_period 10**12": huge("ai21labs__Jamba-v0.1", attn_layer_period=10**12),
    "Jamba period and offset 10**12": huge(
        "ai21labs__Jamba-v0.1", attn_layer_period=10**12, attn_layer_offset=10**12 - 1
    ),
    "Qwen3-Next full_attention_interval 10**12": huge(
        "Qwen__Qwen3-Next-80B-A3B-Instruct", full_attention_interval=10**12
    ),
    "Llama-4 no_rope_layer_interval 10**12": huge(
        "meta-llama__Llama-4-Scout-17B-16E-Instruct", "text_config", no_rope_layer_interval=10**12
    ),
    "Gemma-3 with 10**12 layers": huge("google__gemma-3-1b-it", num_hidden_layers=10**12),
    "Jamba with 10**12 layers": huge("ai21labs__Jamba-v0.1", num_hidden_layers=10**12),
}


@pytest.mark.parametrize("config", HUGE_PATTERNS.values(), ids=HUGE_PATTERNS.keys())
@pytest.mark.parametrize("command", [["size", "--context", "4096"], ["capacity", *CAPACITY]])
def test_a_huge_layer_pattern_answers_or_refuses_within_seconds(capsys, tmp_path, command, config):
    """These were a MemoryError (a list of 10**12 layers) or a hang."""
    path = write_config(tmp_path, config)
    status, out, err, seconds = run(capsys, [command[0], path, *command[1:]])
    assert seconds < SECONDS, seconds
    if status == 0:
        assert out.strip() and "Traceback" not in err
    else:
        lines = err.strip().splitlines()
        assert status == 2 and out == "" and len(lines) == 1 and lines[0].startswith("kvlib: error: "), err


def test_a_period_beyond_the_stack_leaves_the_offset_layer_alone(capsys, tmp_path):
    """attn_layer_period 10**12 with Jamba's offset 4: layer 4 is the only attention layer of 32, as
    transformers' `i % period == offset` says; 1 x 8 KV heads x 128 x 2 (K, V) x 2 B = 4,096 B per token."""
    path = write_config(tmp_path, HUGE_PATTERNS["Jamba attn_layer_period 10**12"])
    status, out, err, _ = run(capsys, ["size", path, "--context", "4096", "--json"])
    assert status == 0, err
    summary = json.loads(out)
    assert summary["bytes_per_token"] == 4096, summary


# ------------------------------------------------------------ train


def test_a_huge_batch_size_is_refused_before_any_document(capsys, tmp_path):
    """--batch-size 100000 was stuck generating documents."""
    one_line_refusal(
        capsys, ["train", "--out", str(tmp_path / "m.safetensors"), "--batch-size", "100000"], "--batch-size"
    )


@pytest.mark.parametrize("out", ["/proc/x/y.safetensors", "/proc/x/y", "/dev/null/m.safetensors"])
def test_an_unwritable_out_is_refused_before_training(capsys, out):
    """--out /proc/x trained first and failed at the end."""
    one_line_refusal(capsys, ["train", "--out", out, "--steps", "2000"], "--out")


def long_context_file(tmp_path: Path) -> Path:
    """A small kvlib model file, checksum and all, whose metadata says max_seq_len 10**12."""
    path = tmp_path / "long.safetensors"
    save_model(TinyLlama(ModelConfig(d_model=32, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=64)), path)
    tensors = load_file(str(path))
    config = {**json.loads(_metadata(path)["config"]), "max_seq_len": 10**12}
    save_file(tensors, str(path), metadata={"config": json.dumps(config), "info": "{}"})
    path.with_name(path.name + ".sha256").write_text(f"{sha256_of(path)}  {path.name}\n")
    return path


def _metadata(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def test_a_checkpoint_claiming_a_trillion_positions_is_refused_in_one_line(capsys, tmp_path):
    """Its rotary table of 10**12 positions was an allocator error after loading."""
    path = long_context_file(tmp_path)
    with pytest.raises(KVLibError, match="max_seq_len 1,000,000,000,000"):
        load_model(path)
    one_line_refusal(
        capsys,
        ["train", "--uptrain", str(path), "--num-kv-heads", "1", "--out", str(tmp_path / "o.safetensors")],
        "max_seq_len 1,000,000,000,000",
    )
    assert not (tmp_path / "o.safetensors").exists()


# ------------------------------------------------------------ as a reader types it


def test_the_command_line_refuses_in_one_line_with_status_2():
    """`python -m kvlib` in a subprocess: status 2, one stderr line, no traceback."""
    result = kvlib("capacity", "Llama-3-8B", *CAPACITY, "--tensor-parallel-size", "0", timeout=120)
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.strip().splitlines() == [
        "kvlib: error: --tensor-parallel-size must be an integer from 1 to 1,000,000,000,000, not 0"
    ]
