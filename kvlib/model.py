"""A tiny Llama-style decoder (RMSNorm, rotary positions, SwiGLU, grouped K/V heads).

Chapter 1 generates text with it three ways (no cache, preallocated cache, cache grown
by concatenation); chapter 3 runs it on a paged cache. Module and parameter names follow
Hugging Face's ``LlamaForCausalLM`` so its weights load without renaming.

The model does not know how its keys and values are stored. A forward pass asks the
cache for the positions of the new tokens (``cache.prepare``), and each layer hands the
cache its new K and V together with its queries (``cache.attend``); the cache stores
them and returns the attention output. ``kvlib.cache`` has the contiguous caches,
``kvlib.paged`` the paged one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.attention import grouped_attention


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
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise KVLibError(f"ModelConfig.{name} must be a positive integer, not {value!r}")
        if self.d_model % self.num_heads:
            raise KVLibError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise KVLibError(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise KVLibError(f"head_dim (d_model / num_heads = {self.head_dim}) must be even for rotary positions")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


class KVCache(Protocol):
    """What the model needs from a cache (see ``kvlib.cache`` and ``kvlib.paged``)."""

    def prepare(self, num_new: int) -> torch.Tensor:
        """Make room for ``num_new`` tokens per sequence; return their positions, (batch, num_new)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this layer's new k, v (batch, kv_heads, num_new, head_dim) and return the
        attention of q (batch, heads, num_new, head_dim) over every stored token."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary_inv_freq(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """Angular speed of each of the head_dim / 2 rotated pairs (Llama's default RoPE), float32."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles for (batch, seq) positions: each (batch, 1, seq, head_dim).

    The angles are float32 whatever the model's dtype, as in transformers: in 16 bits, the
    angle of a position in the thousands would already be off by a large fraction of a turn.
    """
    angles = positions.float()[..., None] * inv_freq  # (batch, seq, head_dim / 2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (batch, 1, seq, head_dim)
    return angles.cos(), angles.sin()


def new_token_rotary(tokens: torch.Tensor, cache: KVCache | None, config: ModelConfig):
    """cos and sin for the tokens (batch, seq) of a forward pass: at the positions the cache
    gives them, or at 0 .. seq-1 when there is no cache and the tokens are the whole sequence."""
    batch, seq = tokens.shape
    if cache is None:
        if seq > config.max_seq_len:
            raise KVLibError(f"sequence of {seq} tokens is longer than max_seq_len ({config.max_seq_len})")
        positions = torch.arange(seq, device=tokens.device).expand(batch, seq)
    else:
        positions = cache.prepare(seq)
    return rotary_cos_sin(positions, rotary_inv_freq(config.head_dim, config.rope_theta, tokens.device))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + head_dim/2) of x (batch, heads, seq, head_dim) by the angles."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.d_model, config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.d_model, config.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.d_model, config.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.d_model, bias=False)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)  # (batch, heads, seq, head_dim)
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (batch, kv_heads, seq, head_dim)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = grouped_attention(q, k, v) if cache is None else cache.attend(layer, q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    """Decoder-only transformer with seeded random weights (``config.seed``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
            self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
            self.norm = RMSNorm(config.d_model, config.norm_eps)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None, last_only: bool = False) -> torch.Tensor:
        """tokens (batch, seq) -> logits (batch, seq, vocab), or (batch, 1, vocab) if ``last_only``.

        Without a cache the tokens are the whole sequence from position 0; with one they
        are the next tokens of the sequences the cache holds. Generation needs only the
        last position's logits (``last_only``), which spares the output projection of
        every earlier position, as ``transformers`` does with ``logits_to_keep``.
        """
        cos, sin = new_token_rotary(tokens, cache, self.config)
        x = self.embed_tokens(tokens)  # (batch, seq, d_model)
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, i, cache)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x))
