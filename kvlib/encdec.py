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

from kvlib import KVLibError
from kvlib.attention import grouped_attention
from kvlib.cache import ConcatKVCache
from kvlib.model import MLP, Attention, Block, KVCache, ModelConfig, RMSNorm, new_token_rotary


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
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
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


@dataclass
class EncDecGeneration:
    """Tokens of :func:`generate_encdec` and the bytes each cache held after every step."""

    tokens: torch.Tensor  # (batch, 1 + num_new): start token, then the generated ones
    self_cache_bytes: list[int]  # per step: bytes of the self-attention K/V tensors (0 without a cache)
    cross_cache_bytes: list[int]  # per step: bytes of the cross-attention K/V tensors held (0 without a cache)
    cross_kv_projections: int  # how many times a layer projected the encoder output to K and V


@torch.inference_mode()
def generate_encdec(model: EncoderDecoder, source: torch.Tensor, num_new: int, use_cache: bool = True) -> EncDecGeneration:
    """Greedy decoding from a start token (id 0) for the encoded ``source`` (batch, src_len).

    With ``use_cache`` the cross-attention K/V are computed once and the self-attention
    K/V grow in a :class:`~kvlib.cache.ConcatKVCache` (whose tensors are exactly what is
    held); without it, every step recomputes both from scratch.
    """
    if source.dim() != 2 or source.shape[1] < 1:
        raise KVLibError(f"source must be a (batch, src_len >= 1) tensor of token ids, not shape {tuple(source.shape)}")
    if not isinstance(num_new, int) or num_new < 1 or num_new + 1 > model.config.max_seq_len:
        raise KVLibError(f"num_new must be an integer from 1 to max_seq_len - 1 ({model.config.max_seq_len - 1}), not {num_new!r}")
    memory = model.encode(source)
    tokens = torch.zeros(source.shape[0], 1, dtype=torch.long, device=source.device)
    cache = ConcatKVCache(model.config, device=source.device) if use_cache else None
    cross = model.cross_kv(memory) if use_cache else None
    projections = model.config.num_layers if use_cache else 0
    self_bytes, cross_bytes = [], []
    for _ in range(num_new):
        if not use_cache:
            cross = model.cross_kv(memory)  # recomputed at every step
            projections += model.config.num_layers
        logits = model.decode(tokens if cache is None else tokens[:, -1:], cross, cache)
        tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)
        self_bytes.append(cache.num_bytes if use_cache else 0)
        cross_bytes.append(cross.num_bytes if use_cache else 0)
    return EncDecGeneration(tokens, self_bytes, cross_bytes, projections)


def plot_cache_bytes(run: EncDecGeneration):
    """Bytes held by the self-attention and the cross-attention cache after each generated token."""
    from kvlib.plotting import axes

    fig, ax = axes("Which cache grows", "generated tokens", "KiB held", size=(6.4, 3.2))
    steps = range(1, len(run.self_cache_bytes) + 1)
    ax.plot(steps, [b / 1024 for b in run.self_cache_bytes], color="C0", label="self-attention K/V")
    ax.plot(steps, [b / 1024 for b in run.cross_cache_bytes], color="C2", label="cross-attention K/V")
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig
