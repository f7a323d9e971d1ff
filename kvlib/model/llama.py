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

import torch
from torch import nn
from torch.nn import functional as F

from kvlib.model.attention import grouped_attention
from kvlib.model.config import KVCache, ModelConfig
from kvlib.model.init import seeded_weights
from kvlib.model.rotary import apply_rotary, new_token_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.q_proj = nn.Linear(config.d_model, config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.d_model, config.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.d_model, config.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.d_model, bias=False)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = (
            self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        )  # (batch, heads, seq, head_dim)
        k = (
            self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        )  # (batch, kv_heads, seq, head_dim)
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
        with seeded_weights(config.seed):
            self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
            self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
            self.norm = RMSNorm(config.d_model, config.norm_eps)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None, last_only: bool = False
    ) -> torch.Tensor:
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
