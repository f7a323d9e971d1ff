"""The shipped weights of chapter 7's models: safetensors files with their config and a checksum.

:func:`save_model` writes a :class:`~kvlib.model.llama.TinyLlama`'s weights in float16 (half
the bytes; the chapter's reference is the model as loaded, so the rounding costs nothing it
measures), its :class:`~kvlib.model.config.ModelConfig` and how it was trained in the file's
metadata, and the file's SHA-256 beside it (``NAME.safetensors.sha256``).
:func:`load_model` refuses a file whose checksum does not match (a truncated download, a Git LFS
pointer, an edited file) with a one-line :class:`~kvlib.KVLibError`, and builds the model in
float32 for the chapter to run.
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


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def save_model(model: TinyLlama, path: Path, info: dict | None = None) -> str:
    """Write ``model``'s weights (float16), config and ``info`` to ``path``; return the checksum."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to(torch.float16).contiguous() for name, t in model.state_dict().items()}
    metadata = {"config": json.dumps(dataclasses.asdict(model.config)), "info": json.dumps(info or {})}
    save_file(tensors, str(path), metadata=metadata)
    digest = sha256_of(path)
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    return digest


def model_info(path: Path) -> dict:
    """The ``info`` a file was saved with (how it was trained), after checking its checksum."""
    path = _checked(Path(path))
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["info"])


def load_model(path: Path) -> TinyLlama:
    """The :class:`TinyLlama` saved at ``path``, in float32 and eval mode, after checking its checksum."""
    path = _checked(Path(path))
    try:
        with safe_open(str(path), framework="pt") as f:
            config = ModelConfig(**json.loads(f.metadata()["config"]))
        tensors = load_file(str(path))
    except (SafetensorError, KeyError, TypeError, ValueError) as exc:
        raise KVLibError(f"{path} is not a kvlib model file ({exc})") from None
    model = TinyLlama(config)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    if missing or unexpected:
        raise KVLibError(f"{path} does not fit {config}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model.eval().requires_grad_(False)


def _checked(path: Path) -> Path:
    """``path`` if it exists and matches the checksum stored beside it; else a one-line error."""
    sums = path.with_name(path.name + ".sha256")
    if not path.is_file():
        raise KVLibError(f"no model file at {path}")
    if not sums.is_file():
        raise KVLibError(f"no checksum file {sums.name} beside {path}")
    expected = sums.read_text().split()[0] if sums.read_text().split() else ""
    if sha256_of(path) != expected:
        raise KVLibError(f"{path.name} does not match its checksum (damaged, or a Git LFS pointer?)")
    return path
