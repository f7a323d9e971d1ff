"""Tests of kvlib.train.checkpoint: a saved model loads back as its float16 rounding, with its checksum;
damaged, missing, pointer and foreign files are one-line errors (chapter 7)."""

import copy
import hashlib
import json

import pytest
import torch
from safetensors.torch import save_file

from kvlib import KVLibError
from kvlib.model.llama import TinyLlama
from kvlib.train.checkpoint import load_model, model_info, save_model
from kvlib.train.corpus import CorpusConfig, documents
from kvlib.train.trainer import QUALITY_MODEL
from tests.single_thread import one_torch_thread  # noqa: F401

TOKENS = documents(2, 5, CorpusConfig(seq_len=64, probe_from=40)).tokens  # (2, 64)


@pytest.fixture(scope="module")
def model() -> TinyLlama:
    return TinyLlama(QUALITY_MODEL).eval().requires_grad_(False)


@pytest.fixture
def saved(tmp_path, model):
    path = tmp_path / "model.safetensors"
    save_model(model, path, {"num_steps": 3, "first_losses": [5.4779, 5.486]})
    return path


def logits(model: TinyLlama) -> torch.Tensor:
    with torch.inference_mode():
        return model(TOKENS)  # (2, 64, vocab)


def one_line_error(call, message: str) -> None:
    with pytest.raises(KVLibError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_saved_model_loads_back_as_its_float16_rounding(model, saved):
    loaded = load_model(saved)
    assert loaded.config == model.config and not loaded.training
    assert not any(p.requires_grad for p in loaded.parameters())
    state, original = loaded.state_dict(), model.state_dict()
    assert state.keys() == original.keys()
    for name, weight in original.items():  # each weight is exactly its float16 rounding, in float32
        assert state[name].dtype == torch.float32 and torch.equal(state[name], weight.half().float()), name
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    assert torch.equal(logits(loaded), logits(rounded))  # the same weights, the same arithmetic
    # Against the float32 original: float16 keeps 11 significant bits, so each weight moves by at most
    # 2**-12 = 2.4e-4 of itself; summed with random signs over 128-wide products and 4 layers, logits
    # of order 1 (std 0.57 here) move by ~1e-3 (8e-4 seen). 1e-2 is a wide margin; a weight lost,
    # transposed or taken from another layer moves them by tenths.
    torch.testing.assert_close(logits(loaded), logits(model), atol=1e-2, rtol=0)
    assert model_info(saved) == {"num_steps": 3, "first_losses": [5.4779, 5.486]}


def test_the_checksum_file_holds_the_files_sha256(saved, model, tmp_path):
    sums = saved.with_name("model.safetensors.sha256")
    expected = hashlib.sha256(saved.read_bytes()).hexdigest()
    assert sums.read_text() == f"{expected}  model.safetensors\n"  # the format `sha256sum -c` reads
    assert (
        save_model(model, tmp_path / "again.safetensors")
        == hashlib.sha256((tmp_path / "again.safetensors").read_bytes()).hexdigest()
    )


def test_a_file_with_one_byte_changed_is_refused(saved):
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight: still a valid safetensors file
    saved.write_bytes(bytes(data))
    one_line_error(lambda: load_model(saved), "model.safetensors does not match its checksum")
    one_line_error(lambda: model_info(saved), "does not match its checksum")


def test_a_missing_checksum_or_file_is_refused(saved, tmp_path):
    saved.with_name("model.safetensors.sha256").unlink()
    one_line_error(lambda: load_model(saved), "no checksum file model.safetensors.sha256 beside")
    one_line_error(lambda: load_model(tmp_path / "absent.safetensors"), "no model file at")
    one_line_error(lambda: load_model(tmp_path), "no model file at")  # a directory


def test_an_empty_checksum_file_is_refused(saved):
    saved.with_name("model.safetensors.sha256").write_text("\n")
    one_line_error(lambda: load_model(saved), "does not match its checksum")


def test_a_git_lfs_pointer_is_named(saved):
    digest = hashlib.sha256(saved.read_bytes()).hexdigest()
    size = saved.stat().st_size
    saved.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{digest}\nsize {size}\n")
    one_line_error(lambda: load_model(saved), "model.safetensors is a Git LFS pointer, not the weights")


def write_with_checksum(path, data: bytes) -> None:
    path.write_bytes(data)
    path.with_name(path.name + ".sha256").write_text(hashlib.sha256(data).hexdigest() + "  x\n")


def test_a_file_that_is_not_safetensors_is_refused(tmp_path):
    path = tmp_path / "notes.safetensors"
    write_with_checksum(path, b"these are notes, not weights\n" * 10)  # the checksum matches
    one_line_error(lambda: load_model(path), "notes.safetensors is not a safetensors file")
    one_line_error(lambda: model_info(path), "is not a safetensors file")


def test_a_safetensors_file_without_a_kvlib_config_is_refused(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    write_with_checksum(path, path.read_bytes())
    one_line_error(lambda: load_model(path), "plain.safetensors is not a kvlib model file")
    save_file({"w": torch.zeros(2)}, str(path), metadata={"config": "[1, 2]"})
    write_with_checksum(path, path.read_bytes())
    one_line_error(lambda: load_model(path), "config and info must be JSON objects")
    save_file(
        {"w": torch.zeros(2)}, str(path), metadata={"config": json.dumps({"num_layers": 2, "colour": 1})}
    )
    write_with_checksum(path, path.read_bytes())
    one_line_error(lambda: load_model(path), "config has unknown fields ['colour']")
    save_file({"w": torch.zeros(2)}, str(path), metadata={"config": json.dumps({"num_layers": 0})})
    write_with_checksum(path, path.read_bytes())
    one_line_error(lambda: load_model(path), "ModelConfig.num_layers must be a positive integer, not 0")


def test_tensors_that_do_not_fit_the_config_are_refused(model, tmp_path):
    path = tmp_path / "short.safetensors"
    tensors = {k: v.half().contiguous() for k, v in model.state_dict().items()}
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:100].contiguous()  # 100 rows, not 192
    del tensors["norm.weight"]
    config = json.dumps({**vars(QUALITY_MODEL)})
    save_file(tensors, str(path), metadata={"config": config, "info": "{}"})
    write_with_checksum(path, path.read_bytes())
    one_line_error(
        lambda: load_model(path), "missing ['norm.weight'], unexpected [], other shapes ['lm_head.weight']"
    )


def test_what_cannot_be_saved_is_refused(model, tmp_path):
    path = tmp_path / "m.safetensors"
    one_line_error(lambda: save_model(model, path, {"when": object()}), "info must be a JSON object")
    one_line_error(lambda: save_model(model, path, {"loss": float("nan")}), "info must be a JSON object")
    one_line_error(lambda: save_model(torch.nn.Linear(2, 2), path), "model must be a kvlib TinyLlama")
    big = copy.deepcopy(model)
    with torch.no_grad():
        big.layers[1].mlp.up_proj.weight[0, 0] = 1e5  # float16 ends at 65504: it would be stored as inf
    one_line_error(
        lambda: save_model(big, path), "not finite in float16 (beyond 65504, or nan): layers.1.mlp"
    )
    (tmp_path / "dir.safetensors").mkdir()
    one_line_error(lambda: save_model(model, tmp_path / "dir.safetensors"), "cannot write")
    assert not path.exists()  # nothing was written by the refused calls
