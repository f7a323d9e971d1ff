"""python -m kvlib train: bad flags are one line and exit status 2 before any training; a two-step run and
a two-step uptraining write loadable, checksummed files (chapter 7)."""

import hashlib
import json

import pytest

from kvlib.cli import main
from kvlib.measure.timing import torch_threads
from kvlib.train.checkpoint import load_model, model_info
from kvlib.train.trainer import QUALITY_MODEL
from tests.single_thread import one_torch_thread  # noqa: F401
from tests.test_cli import kvlib


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A two-step training at batch 1 (~0.5 s), shared by the tests below."""
    path = tmp_path_factory.mktemp("train") / "tiny.safetensors"
    with torch_threads(1):  # the module-scoped fixture runs outside one_torch_thread
        assert main(["train", "--out", str(path), "--steps", "2", "--batch-size", "1", "--json"]) == 0
    return path


def one_error_line(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert lines[0].startswith("kvlib: error:") and message in lines[0], lines[0]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--out", "model.pt"], "--out must name a .safetensors file, not 'model.pt'"),
        (["--out", ".safetensors"], "--out must name a .safetensors file"),
        (
            ["--out", "m.safetensors", "--uptrain", "x.safetensors"],
            "--uptrain and --num-kv-heads go together",
        ),
        (["--out", "m.safetensors", "--num-kv-heads", "2"], "--uptrain and --num-kv-heads go together"),
        (["--out", "m.safetensors", "--pool", "keep"], "--pool applies to --uptrain only"),
        (["--out", "m.safetensors", "--steps", "0"], "--steps must be from 1 to 2**20, not 0"),
        (["--out", "m.safetensors", "--steps", "-3"], "--steps must be from 1 to 2**20, not -3"),
        (["--out", "m.safetensors", "--steps", str(2**20 + 1)], "--steps must be from 1 to 2**20"),
        (["--out", "m.safetensors", "--batch-size", "0"], "--batch-size must be a positive integer, not 0"),
        (["--out", "m.safetensors", "--data-seed", "-1"], "--data-seed must be from 0 to 2047, not -1"),
        (["--out", "m.safetensors", "--data-seed", "2048"], "--data-seed must be from 0 to 2047, not 2048"),
        (
            ["--out", "m.safetensors", "--uptrain", "absent.safetensors", "--num-kv-heads", "2"],
            "--uptrain: no model file at absent.safetensors",
        ),
        (
            ["--out", "m.safetensors", "--uptrain", "absent.safetensors", "--num-kv-heads", "0"],
            "--num-kv-heads must be a positive integer, not 0",
        ),
    ],
)
def test_bad_flags_are_one_line_errors(capsys, tmp_path, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)  # relative --out paths land here; none may be written
    one_error_line(capsys, ["train", *flags], message)
    assert list(tmp_path.iterdir()) == []


def test_out_must_be_a_writable_file_path(capsys, tmp_path):
    (tmp_path / "dir.safetensors").mkdir()
    one_error_line(capsys, ["train", "--out", str(tmp_path / "dir.safetensors")], "is a directory")
    (tmp_path / "file").write_text("")
    one_error_line(capsys, ["train", "--out", str(tmp_path / "file" / "m.safetensors")], "cannot write in")


def test_num_kv_heads_must_divide_the_models_heads(capsys, trained, tmp_path):
    out = str(tmp_path / "kv3.safetensors")
    argv = ["train", "--out", out, "--uptrain", str(trained), "--num-kv-heads", "3", "--steps", "1"]
    one_error_line(capsys, argv, "num_kv_heads (3) must divide the model's 8 K/V heads")
    argv[-3] = "16"
    one_error_line(capsys, argv, "num_kv_heads (16) exceeds the model's 8 K/V heads")


def test_a_damaged_uptrain_file_is_refused(capsys, trained, tmp_path):
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(trained.read_bytes()[:-1])  # truncated
    copy.with_name("copy.safetensors.sha256").write_text(
        trained.with_name(trained.name + ".sha256").read_text()
    )
    argv = ["train", "--out", str(tmp_path / "o.safetensors"), "--uptrain", str(copy), "--num-kv-heads", "2"]
    one_error_line(capsys, argv, "copy.safetensors does not match its checksum")


def test_a_two_step_run_writes_a_loadable_checksummed_file(trained, capsys):
    model = load_model(trained)  # verifies the checksum
    assert model.config == QUALITY_MODEL
    digest = hashlib.sha256(trained.read_bytes()).hexdigest()
    assert trained.with_name(trained.name + ".sha256").read_text().split()[0] == digest
    info = model_info(trained)
    assert (info["num_steps"], info["batch_size"], info["data_seed"]) == (2, 1, 0)
    assert len(info["first_losses"]) == 2 and info["from"] == "seeded initial weights"


def test_the_summary_and_progress(tmp_path, capsys):
    path = tmp_path / "one.safetensors"
    assert main(["train", "--out", str(path), "--steps", "1", "--batch-size", "1", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert summary["num_steps"] == 1 and summary["last_loss"] == summary["first_losses"][0]
    assert captured.err.startswith("step     0  loss ")  # progress: every 100th step and the last
    assert main(["train", "--out", str(path), "--steps", "1", "--batch-size", "1"]) == 0
    assert "num_steps: 1\n" in capsys.readouterr().out  # without --json: one "key: value" a line


def test_an_uptraining_writes_a_model_with_two_kv_heads(trained, tmp_path, capsys):
    out = tmp_path / "kv2.safetensors"
    argv = ["train", "--out", str(out), "--uptrain", str(trained), "--num-kv-heads", "2"]
    assert main([*argv, "--steps", "2", "--batch-size", "1", "--json"]) == 0
    model = load_model(out)
    assert model.config.num_kv_heads == 2 and model.config.num_heads == 8
    assert model.layers[0].self_attn.k_proj.weight.shape == (2 * 16, 128)  # 2 heads x head_dim 16
    info = model_info(out)
    assert (info["from"], info["pool"], info["num_kv_heads"]) == ("tiny.safetensors", "mean", 2)
    assert info["data_seed"] == 1  # uptraining reads documents pre-training did not
    assert info["peak_lr"] == pytest.approx(3e-3 * 0.1)  # where pre-training's cosine ended


def test_the_exit_status_and_stderr_of_the_command_line():
    result = kvlib("train", "--out", "m.safetensors", "--steps", "0", timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "kvlib: error: --steps must be from 1 to 2**20, not 0\n"
