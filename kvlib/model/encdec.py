"""A small encoder-decoder with cross-attention, to see which cache grows (chapter 1).

In an encoder-decoder (the original Transformer {cite}`vaswani2017attention`, T5,
Whisper) every decoder layer has two attentions. Self-attention looks at the tokens
generated so far, so its cache gains one key and one value per layer at every step.
Cross-attention looks at the encoder's output, which is fixed once the input is
encoded, so its keys and values are computed once and never grow. This model reuses
:mod:`kvlib.model`'s blocks: the encoder is a stack of decoder blocks whose attention
sees every position (:class:`FullAttention`), and each decoder block adds a
:class:`CrossAttention` between self-attention and the MLP.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kvlib.model.attention import grouped_attention
from kvlib.model.config import KVCache, ModelConfig
from kvlib.model.init import seeded_weights
from kvlib.model.llama import MLP, Attention, Block, RMSNorm
from kvlib.model.rotary import new_token_rotary


class FullAttention:
    """A stand-in cache for the encoder: stores nothing and lets every position see every other."""

    def __init__(self, batch: int, length: int, device=None):
        self.positions = torch.arange(length, device=device).expand(batch, length)

    def prepare(self, num_new: int) -> torch.Tensor:
        return self.positions

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        return grouped_attention(q, k, v, q_start=k.shape[2])  # a start past the last key masks nothing


@dataclass
class CrossKV:
    """Cross-attention keys and values of every decoder layer, each (batch, kv_heads, src_len, head_dim)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class CrossAttention(Attention):
    """Queries from the decoder, keys and values from the encoder output (no positions, no mask).

    The same four projections as self-attention; only where K and V come from differs.
    """

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the encoder output (batch, src_len, d_model): the part worth caching."""
        batch, src_len, _ = memory.shape
        k = self.k_proj(memory).view(batch, src_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(memory).view(batch, src_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return k, v  # (batch, kv_heads, src_len, head_dim) each

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        out = grouped_attention(q, k, v, q_start=k.shape[2])  # every query sees the whole source
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class DecoderBlock(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = Attention(config)
        self.cross_attn_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.cross_attn = CrossAttention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None, cross_k, cross_v) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer, cache)
        x = x + self.cross_attn(self.cross_attn_layernorm(x), cross_k, cross_v)
        return x + self.mlp(self.post_attention_layernorm(x))


class EncoderDecoder(nn.Module):
    """``config.num_layers`` encoder blocks and as many decoder blocks, one shared embedding, seeded weights."""

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
        x = self.embed_tokens(source)
        for i, block in enumerate(self.encoder_layers):
            x = block(x, cos, sin, i, full)
        return self.encoder_norm(x)

    def cross_kv(self, memory: torch.Tensor) -> CrossKV:
        """Every decoder layer's cross-attention keys and values for an encoder output."""
        pairs = [block.cross_attn.project_kv(memory) for block in self.decoder_layers]
        return CrossKV([k for k, _ in pairs], [v for _, v in pairs])

    def decode(self, tokens: torch.Tensor, cross: CrossKV, cache: KVCache | None = None) -> torch.Tensor:
        """Logits of the last position, (batch, vocab); ``tokens`` as for :meth:`TinyLlama.forward`."""
        cos, sin = new_token_rotary(tokens, cache, self.config)
        x = self.embed_tokens(tokens)
        for i, block in enumerate(self.decoder_layers):
            x = block(x, cos, sin, i, cache, cross.k[i], cross.v[i])
        return self.lm_head(self.norm(x[:, -1]))
