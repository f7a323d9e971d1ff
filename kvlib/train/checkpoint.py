"""The shipped weights of chapter 7's models: safetensors files with their config and a checksum.

:func:`save_model` writes a :class:`~kvlib.model.llama.TinyLlama`'s weights in float16 (half
the bytes; the chapter's reference is the model as loaded, so the rounding costs nothing it
measures), its :class:`~kvlib.model.config.ModelConfig` and how it was trained in the file's
metadata, and the file's SHA-256 beside it (``NAME.safetensors.sha256``).
:func:`load_model` refuses a file whose checksum does not match (a truncated download, a Git LFS
pointer, an edited file), a file that is not safetensors, and one whose tensors do not fit its
config, each with a one-line :class:`~kvlib.KVLibError`, and builds the model in float32 for
the chapter to run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama

WEIGHTS_DIR = Path(__file__).parent / "weights"  # the shipped files, inside the package
LFS_POINTER_START = b"version https://git-lfs"  # how a Git LFS pointer file begins


MAX_FILE_SEQ_LEN = 2**17  # the longest context a model file may declare: Llama 3.1's 131,072 positions


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise KVLibError(f"cannot read {path} ({exc.strerror or exc})") from None


def save_model(model: TinyLlama, path: Path, info: dict | None = None) -> str:
    """Write ``model``'s weights (float16), config and ``info`` to ``path``; return the checksum.

    ``info`` must be a JSON object (the training record); a weight beyond float16's range
    (65504) is refused rather than stored as infinity.
    """
    if not isinstance(model, TinyLlama):
        raise KVLibError(f"model must be a kvlib TinyLlama, not {type(model).__name__}")
    path = Path(path)
    tensors = {name: t.detach().to(torch.float16).contiguous() for name, t in model.state_dict().items()}
    overflow = [name for name, t in tensors.items() if not bool(torch.isfinite(t).all())]
    if overflow:
        raise KVLibError(f"weights not finite in float16 (beyond 65504, or nan): {', '.join(overflow[:3])}")
    try:
        metadata = {
            "config": json.dumps(dataclasses.asdict(model.config)),
            "info": json.dumps({} if info is None else dict(info), allow_nan=False),
        }
    except (TypeError, ValueError) as exc:
        raise KVLibError(f"info must be a JSON object of plain values ({exc})") from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata=metadata)
        digest = sha256_of(path)
        path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    except (OSError, SafetensorError) as exc:
        raise KVLibError(f"cannot write {path} ({getattr(exc, 'strerror', None) or exc})") from None
    return digest


def model_info(path: Path) -> dict:
    """The ``info`` a file was saved with (how it was trained), after checking its checksum."""
    path = _checked(Path(path))
    return _metadata(path)[1]


def load_model(path: Path) -> TinyLlama:
    """The :class:`TinyLlama` saved at ``path``, in float32 and eval mode, after checking its checksum."""
    path = _checked(Path(path))
    config_fields, _ = _metadata(path)
    config = ModelConfig(**config_fields)  # its own one-line errors for bad values
    if config.max_seq_len > MAX_FILE_SEQ_LEN:  # the rotary table, built on first use, would not fit in memory
        raise KVLibError(
            f"{path.name}'s config says max_seq_len {config.max_seq_len:,}; a kvlib model file may say "
            f"at most {MAX_FILE_SEQ_LEN:,} (Llama 3.1's context)"
        )
    try:
        tensors = load_file(str(path))
    except SafetensorError as exc:
        raise KVLibError(f"{path.name} is not a kvlib model file ({exc})") from None
    with torch.device("meta"):  # the expected shapes, without drawing or allocating a weight
        expected = {name: tuple(t.shape) for name, t in TinyLlama(config).state_dict().items()}
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    if found != expected:
        missing = sorted(expected.keys() - found.keys())[:3]
        unexpected = sorted(found.keys() - expected.keys())[:3]
        wrong = sorted(n for n in expected.keys() & found.keys() if expected[n] != found[n])[:3]
        raise KVLibError(
            f"{path.name} does not fit its config: missing {missing}, unexpected {unexpected}, "
            f"other shapes {wrong}"
        )
    try:
        model = TinyLlama(config)  # its rotary table spans max_seq_len, which no tensor shows
    except (RuntimeError, MemoryError) as exc:
        raise KVLibError(f"cannot build the model of {path.name} ({str(exc).splitlines()[0]})") from None
    model.load_state_dict({k: v.float() for k, v in tensors.items()})
    return model.eval().requires_grad_(False)


def _metadata(path: Path) -> tuple[dict, dict]:
    """The ``config`` fields and the ``info`` of a kvlib model file (one-line errors if it is none)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except SafetensorError as exc:
        raise KVLibError(f"{path.name} is not a safetensors file ({exc})") from None
    try:
        config, info = json.loads(metadata["config"]), json.loads(metadata.get("info", "{}"))
    except (KeyError, ValueError) as exc:
        raise KVLibError(f"{path.name} is not a kvlib model file (no readable config: {exc!r})") from None
    if not isinstance(config, dict) or not isinstance(info, dict):
        raise KVLibError(f"{path.name} is not a kvlib model file (config and info must be JSON objects)")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    if not config.keys() <= fields:
        raise KVLibError(f"{path.name}'s config has unknown fields {sorted(config.keys() - fields)[:3]}")
    return config, info


def _checked(path: Path) -> Path:
    """``path`` if it exists and matches the checksum stored beside it; else a one-line error."""
    sums = path.with_name(path.name + ".sha256")
    if not path.is_file():
        raise KVLibError(f"no model file at {path}")
    if not sums.is_file():
        raise KVLibError(f"no checksum file {sums.name} beside {path}")
    try:
        with path.open("rb") as f:
            start = f.read(len(LFS_POINTER_START))
        words = sums.read_text(errors="replace").split()
    except OSError as exc:
        raise KVLibError(f"cannot read {path} or its checksum ({exc.strerror or exc})") from None
    if start == LFS_POINTER_START:
        raise KVLibError(f"{path.name} is a Git LFS pointer, not the weights (fetch them: git lfs pull)")
    if not words or sha256_of(path) != words[0].lower():
        raise KVLibError(f"{path.name} does not match its checksum in {sums.name} (damaged or edited?)")
    return path
