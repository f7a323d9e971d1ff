"""Edges of training and checkpoints: a huge max_seq_len in a file's metadata, a huge batch, an --out that
cannot be created; each refused up front with a KVLibError stating the limit, before any work is done."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from kvlib import KVLibError
from kvlib.cli import main
from kvlib.model.llama import TinyLlama
from kvlib.train.checkpoint import MAX_FILE_SEQ_LEN, load_model
from kvlib.train.trainer import MAX_BATCH_SIZE, QUALITY_MODEL, TrainConfig
from tests.train.test_checkpoint import write_with_checksum


def test_a_checkpoint_declaring_a_huge_max_seq_len_is_refused(tmp_path):
    path = tmp_path / "long.safetensors"
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in TinyLlama(QUALITY_MODEL).state_dict().items()}
    tensors = {k: torch.zeros(shape, dtype=torch.float16) for k, shape in shapes.items()}
    config = json.dumps({**vars(QUALITY_MODEL), "max_seq_len": 10**12})
    save_file(tensors, str(path), metadata={"config": config, "info": "{}"})
    write_with_checksum(path, path.read_bytes())
    with pytest.raises(KVLibError, match=f"max_seq_len 1,000,000,000,000; .* at most {MAX_FILE_SEQ_LEN:,}"):
        load_model(path)


def test_a_batch_beyond_the_limit_is_refused():
    with pytest.raises(KVLibError, match=f"batch_size must be at most {MAX_BATCH_SIZE}"):
        TrainConfig(batch_size=100_000)


def one_error_line(capsys, argv, message):
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_the_cli_refuses_a_huge_batch_before_training(capsys, tmp_path):
    out = str(tmp_path / "m.safetensors")
    one_error_line(
        capsys, ["train", "--out", out, "--batch-size", "100000"], "--batch-size must be at most 1024"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc on this system")
def test_the_cli_refuses_an_out_it_cannot_create_before_training(capsys):
    # /proc's permission bits say writable (to root), but no file can be created there
    one_error_line(capsys, ["train", "--out", "/proc/x.safetensors"], "cannot write in /proc")
