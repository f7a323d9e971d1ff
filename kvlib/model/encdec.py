"""A small encoder-decoder with cross-attention, to see which cache grows (chapters 1 and 6).

In an encoder-decoder (the original Transformer {cite}`vaswani2017attention`, T5,
Whisper) every decoder layer has two attentions. Self-attention looks at the tokens
generated so far, so its cache gains one key and one value per layer at every step.
Cross-attention looks at the encoder's output, which is fixed once the input is
encoded, so its keys and values are computed once and never grow. This model reuses
:mod:`kvlib.model.llama`'s blocks: the encoder is a stack of decoder blocks whose attention
sees every position (:class:`FullAttention`), and each decoder block adds a
:class:`CrossAttention` between self-attention and the MLP. Its generation loop is
:func:`kvlib.cache.generation.generate_encdec`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kvlib.model.attention import grouped_attention
from kvlib.model.config import KVCache, ModelConfig
from kvlib.model.llama import MLP, Attention, Block, RMSNorm
from kvlib.model.rotary import new_token_rotary
from kvlib.model.seeding import seeded_weights


class FullAttention:
    """A stand-in cache for the encoder: stores nothing and lets every position see every other."""

    def __init__(self, batch: int, length: int, device=None):
        self.positions = torch.arange(length, device=device).expand(batch, length)  # (batch, length)

    def prepare(self, num_new: int) -> torch.Tensor:
        """Positions 0 .. length-1 of every source sequence, (batch, length): the whole input at once."""
        return self.positions

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        """q (batch, heads, length, head_dim) over k, v (batch, kv_heads, length, head_dim), unmasked."""
        return grouped_attention(q, k, v, q_start=k.shape[2])  # a start past the last key masks nothing


@dataclass
class CrossKV:
    """Cross-attention keys and values of every decoder layer, each (batch, kv_heads, src_len, head_dim)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def num_bytes(self) -> int:
        """Bytes of every layer's cross-attention K and V: fixed once the source is encoded."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class CrossAttention(Attention):
    """Queries from the decoder, keys and values from the encoder output (no positions, no mask).

    The same four projections as self-attention; only where K and V come from differs.
    """

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the encoder output (batch, src_len, d_model): the part worth caching."""
        k = self.split_heads(self.k_proj, memory, self.num_kv_heads)  # (batch, kv_heads, src_len, head_dim)
        v = self.split_heads(self.v_proj, memory, self.num_kv_heads)  # (batch, kv_heads, src_len, head_dim)
        return k, v

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """x (batch, seq, d_model) of the decoder attends to k, v (batch, kv_heads, src_len, head_dim)."""
        q = self.split_heads(self.q_proj, x, self.num_heads)  # (batch, heads, seq, head_dim)
        out = grouped_attention(q, k, v, q_start=k.shape[2])  # (batch, heads, seq, head_dim), no mask
        return self.merge_heads(out)  # (batch, seq, d_model)


class DecoderBlock(nn.Module):
    """One decoder layer of the encoder-decoder: self-attention, cross-attention, MLP, each pre-norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = Attention(config)
        self.cross_attn_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.cross_attn = CrossAttention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None, cross_k, cross_v) -> torch.Tensor:
        """x (batch, seq, d_model) -> (batch, seq, d_model); cross_k, cross_v: the layer's cross K/V."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, cache)
        x = x + self.cross_attn(self.cross_attn_layernorm(x), cross_k, cross_v)
        return x + self.mlp(self.post_attention_layernorm(x))


class EncoderDecoder(nn.Module):
    """``config.num_layers`` encoder and as many decoder blocks, one shared embedding, seeded weights.

    The weights are drawn in :func:`~kvlib.model.seeding.seeded_weights` (``config.seed``), like
    :class:`~kvlib.model.llama.TinyLlama`'s.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        with seeded_weights(config.seed):
            self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
            self.encoder_layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
            self.encoder_norm = RMSNorm(config.d_model, config.norm_eps)
            self.decoder_layers = nn.ModuleList(DecoderBlock(config) for _ in range(config.num_layers))
            self.norm = RMSNorm(config.d_model, config.norm_eps)
            self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def encode(self, source: torch.Tensor) -> torch.Tensor:
        """source token ids (batch, src_len) -> encoder output (batch, src_len, d_model)."""
        full = FullAttention(*source.shape, device=source.device)
        cos, sin = new_token_rotary(source, full, self.config)
        x = self.embed_tokens(source)  # (batch, src_len, d_model)
        for i, block in enumerate(self.encoder_layers):
            x = block(x, cos, sin, i, full)  # (batch, src_len, d_model)
        return self.encoder_norm(x)

    def cross_kv(self, memory: torch.Tensor) -> CrossKV:
        """Every decoder layer's cross-attention keys and values for an encoder output."""
        pairs = [block.cross_attn.project_kv(memory) for block in self.decoder_layers]
        return CrossKV([k for k, _ in pairs], [v for _, v in pairs])

    def decode(self, tokens: torch.Tensor, cross: CrossKV, cache: KVCache | None = None) -> torch.Tensor:
        """Logits of the last position, (batch, vocab); ``tokens`` as for :meth:`TinyLlama.forward`."""
        cos, sin = new_token_rotary(tokens, cache, self.config)
        x = self.embed_tokens(tokens)  # (batch, seq, d_model)
        for i, block in enumerate(self.decoder_layers):
            x = block(x, cos, sin, i, cache, cross.k[i], cross.v[i])  # (batch, seq, d_model)
        return self.lm_head(self.norm(x[:, -1]))  # (batch, vocab)
