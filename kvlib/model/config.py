"""What every model of the book is built from: its shape and the cache it talks to (chapters 1-3).

:class:`ModelConfig` gives a model's dimensions (``num_kv_heads`` picks MHA, GQA or MQA) and
the seed of its weights; :mod:`kvlib.sizing` computes the same model's cache bytes from the
same field names. :class:`KVCache` is the two-method protocol by which a model stores keys
and values without knowing how: a forward pass asks the cache for the positions of the new
tokens (``prepare``), and each layer hands it the new K and V with its queries and gets the
attention output back (``attend``). :mod:`kvlib.cache.contiguous` implements it with
contiguous tensors (chapter 1), :mod:`kvlib.paged.paged_cache` with blocks (chapter 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from kvlib import KVLibError
from kvlib.checks import is_int, require_int, require_real

MAX_SEED = 2**63 - 1  # torch.manual_seed's largest non-negative seed that every generator takes


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the model. ``num_kv_heads`` picks MHA (= num_heads), GQA, or MQA (= 1)."""

    vocab_size: int = 512
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 8
    d_ff: int = 688
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0

    def __post_init__(self):
        for name in (
            "vocab_size",
            "d_model",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "d_ff",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise KVLibError(f"ModelConfig.{name} must be a positive integer, not {value!r}")
        if self.d_model % self.num_heads:
            raise KVLibError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise KVLibError(
                f"num_heads ({self.num_heads}) must be divisible by num_kv_heads ({self.num_kv_heads})"
            )
        require_real(self.rope_theta, "ModelConfig.rope_theta", positive=True)
        require_real(self.norm_eps, "ModelConfig.norm_eps")
        require_int(self.seed, "ModelConfig.seed", 0, MAX_SEED)
        if self.head_dim % 2:
            raise KVLibError(
                f"head_dim (d_model / num_heads = {self.head_dim}) must be even for rotary positions"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head, d_model / num_heads (the same for queries, keys and values)."""
        return self.d_model // self.num_heads


class KVCache(Protocol):
    """What the model needs from a cache (see ``kvlib.cache`` and ``kvlib.paged``).

    A cache may keep the k and v tensors it is handed. One that copies them into memory of its
    own instead, and whose ``attend`` takes ``out=`` (a float32 tensor of the result's shape that
    a decode step may write the attention into; the caller uses what ``attend`` returns), says so
    with a class attribute ``reuses_buffers = True``: the lean pass (:mod:`kvlib.model.lean`) then
    hands it views of buffers that the next pass overwrites, and a buffer for the attention.
    """

    def prepare(self, num_new: int) -> torch.Tensor:
        """Make room for ``num_new`` tokens per sequence; return their positions, (batch, num_new)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this layer's new k, v (batch, kv_heads, num_new, head_dim) and return the
        attention of q (batch, heads, num_new, head_dim) over every stored token."""
