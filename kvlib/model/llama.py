"""A tiny Llama-style decoder (RMSNorm, rotary positions, SwiGLU, grouped K/V heads).

Chapter 1 generates text with :class:`TinyLlama` three ways (no cache, preallocated cache,
cache grown by concatenation, :mod:`kvlib.cache.generation`); chapter 3 runs it on a paged
cache (:mod:`kvlib.paged.decode_loop`); chapter 6 reuses it. Module and parameter names follow
Hugging Face's ``LlamaForCausalLM`` so its weights load without renaming
(:mod:`kvlib.model.hf`), and its weights are drawn in :func:`~kvlib.model.seeding.seeded_weights`.

The model does not know how its keys and values are stored: each layer hands the cache
(the :class:`~kvlib.model.config.KVCache` protocol) its new K and V with its queries, and the
cache returns the attention output. Without a cache the tokens are the whole sequence and
attention is :func:`~kvlib.model.attention.grouped_attention` over them.

This is the readable model the book shows, one Llama layer after another. The same model tuned
for speed, :class:`~kvlib.model.lean.LeanLlama` (fused projections, functional calls: half the
operators per decode step, none allocating), is a subclass that the benchmarks choose explicitly
(:meth:`TinyLlama.sharing` gives either kind over the same weights).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.checks import check_token_tensor
from kvlib.model.attention import grouped_attention
from kvlib.model.config import KVCache, ModelConfig
from kvlib.model.rotary import RotaryTable, apply_rotary, new_token_rotary
from kvlib.model.seeding import seeded_weights


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned scale (Llama's ``LlamaRMSNorm``), computed in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # (dim,): starts at 1, draws no random numbers
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., dim) divided by its root mean square over the last dimension, times the scale."""
        x32 = x if x.dtype == torch.float32 else x.float()  # (..., dim); no cast to dispatch when float32
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., dim)
        return self.weight * (x32 if x.dtype == torch.float32 else x32.to(x.dtype))  # (..., dim)


class Attention(nn.Module):
    """Self-attention with rotary positions and grouped K/V heads; the cache stores K/V and attends."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.d_model, config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.d_model, config.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.d_model, config.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.d_model, bias=False)

    def split_heads(self, proj: nn.Linear, x: torch.Tensor, num_heads: int) -> torch.Tensor:
        """Project x (batch, seq, d_model) and split it into heads: (batch, num_heads, seq, head_dim)."""
        batch, seq, _ = x.shape
        return proj(x).view(batch, seq, num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """out (batch, heads, seq, head_dim) -> heads side by side, through o_proj: (batch, seq, d_model)."""
        batch, _, seq, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))  # via (batch, seq, heads * head_dim)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None) -> torch.Tensor:
        """x (batch, seq, d_model) of the new tokens -> attention output (batch, seq, d_model).

        cos, sin: (batch, 1, seq, head_dim) rotary angles of the new tokens' positions.
        Without a cache the new tokens are the whole sequence and attend to each other.
        """
        q = apply_rotary(self.split_heads(self.q_proj, x, self.num_heads), cos, sin)
        k = apply_rotary(self.split_heads(self.k_proj, x, self.num_kv_heads), cos, sin)
        v = self.split_heads(self.v_proj, x, self.num_kv_heads)
        # q: (batch, heads, seq, head_dim); k, v: (batch, kv_heads, seq, head_dim)
        out = grouped_attention(q, k, v) if cache is None else cache.attend(layer, q, k, v)
        return self.merge_heads(out)  # out: (batch, heads, seq, head_dim) -> (batch, seq, d_model)


class MLP(nn.Module):
    """Llama's SwiGLU feed-forward layer: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (batch, seq, d_model) -> (batch, seq, d_model), through (batch, seq, d_ff)."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One decoder layer: pre-norm self-attention and pre-norm MLP, each added to the residual stream."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None) -> torch.Tensor:
        """x (batch, seq, d_model) -> (batch, seq, d_model); ``layer`` tells the cache whose K/V these are."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


MAX_ROTARY_POSITIONS = 2**20  # positions of a model's rotary table: 2**20 x head_dim 128 x 2 tables are 1 GiB


class TinyLlama(nn.Module):
    """Decoder-only transformer with seeded random weights (``config.seed``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise KVLibError(f"config must be a kvlib ModelConfig, not {type(config).__name__}")
        if (
            config.max_seq_len > MAX_ROTARY_POSITIONS
        ):  # its rotary table, built on first use, has a row per position
            raise KVLibError(
                f"max_seq_len must be at most {MAX_ROTARY_POSITIONS:,} to build a model (the rotary "
                f"table holds every position), not {config.max_seq_len:,}"
            )
        self.config = config
        try:
            with seeded_weights(config.seed):
                self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
                self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
                self.norm = RMSNorm(config.d_model, config.norm_eps)
                self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        except (RuntimeError, MemoryError) as exc:  # weights too large for memory (vocab_size 10**12 ...)
            raise KVLibError(f"cannot build the model's weights: {str(exc).splitlines()[0][:120]}") from None
        self.rotary = RotaryTable(config)  # cos/sin of every position, looked up by each forward pass

    @classmethod
    def sharing(cls, model: TinyLlama):
        """A model of this class over ``model``'s modules: the same weights (not copies), the same mode."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.config, new.rotary = model.config, model.rotary
        for name, module in model.named_children():
            new.add_module(name, module)
        new.train(model.training)
        return new

    def forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None, last_only: bool = False
    ) -> torch.Tensor:
        """tokens (batch, seq) -> logits (batch, seq, vocab), or (batch, 1, vocab) if ``last_only``.

        Without a cache the tokens are the whole sequence from position 0; with one they
        are the next tokens of the sequences the cache holds. Generation needs only the
        last position's logits (``last_only``), which spares the output projection of
        every earlier position, as ``transformers`` does with ``logits_to_keep``.
        Tokens that are not a (batch, seq) tensor of the vocabulary's ids, or a cache that is no
        cache, are a one-line KVLibError.
        """
        check_token_tensor(tokens, "tokens", self.config.vocab_size)
        if cache is not None and not callable(getattr(cache, "attend", None)):
            raise KVLibError(f"cache must be a KV cache (an object with attend), not {type(cache).__name__}")
        cos, sin = new_token_rotary(tokens, cache, self.config, self.rotary)
        x = self.embed_tokens(tokens)  # (batch, seq, d_model)
        for i, block in enumerate(self.layers):
            x = block(x, cos, sin, i, cache)  # (batch, seq, d_model)
        if last_only:
            x = x[:, -1:]  # (batch, 1, d_model)
        return self.lm_head(self.norm(x))  # (batch, seq or 1, vocab)
