"""Multi-head latent attention (MLA) as DeepSeek-V2/V3 compute it, decoded two ways (chapter 9).

Each token's hidden state is projected down to one latent ``c_kv`` of ``kv_lora_rank``
values (normalised), plus one decoupled rotary key of ``qk_rope_head_dim`` values that all
heads share; that pair is all the cache keeps (512 + 64 = 576 values per token and layer
for DeepSeek-V3). The per-head keys and values are ``W_UK c_kv`` and ``W_UV c_kv``.

- **Expanded** decode (:meth:`MLAAttention.forward` with ``absorbed=False``) up-projects every
  cached latent to per-head K and V at each step and runs ordinary multi-head attention.
- **Absorbed** decode (``absorbed=True``) folds ``W_UK`` into the query
  (``q_nope . W_UK c = (W_UK^T q_nope) . c``) and ``W_UV`` into the output
  (``sum_t p_t W_UV c_t = W_UV sum_t p_t c_t``), so attention is MQA over the latent: every head
  scores the same 576-value vectors, and no per-head K/V is ever formed.

The two are the same function in exact arithmetic; in float32 they differ only by rounding
(the sums run in another order). The model is small enough for a CPU and seeded through
:func:`~kvlib.model.seeding.seeded_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kvlib import KVLibError
from kvlib.checks import require_int, require_real
from kvlib.model.config import MAX_SEED
from kvlib.model.rotary import rotary_inv_freq
from kvlib.model.seeding import seeded_weights


@dataclass(frozen=True)
class MLAConfig:
    """The shape of a small MLA model (DeepSeek-V2/V3's names for its dimensions)."""

    vocab_size: int = 256
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 8
    q_lora_rank: int | None = 64  # None: queries projected directly from the hidden state
    kv_lora_rank: int = 64  # latent values cached per token and layer
    qk_nope_head_dim: int = 32  # per-head query/key values without position
    qk_rope_head_dim: int = 16  # the shared rotary key, cached beside the latent
    v_head_dim: int = 32  # per-head value size
    rope_theta: float = 10_000.0
    seed: int = 0

    def __post_init__(self):
        for key in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "v_head_dim",
        ):
            require_int(getattr(self, key), key, low=1)
        require_int(self.qk_rope_head_dim, "qk_rope_head_dim", low=2)
        if self.qk_rope_head_dim % 2:
            raise KVLibError(
                f"qk_rope_head_dim must be even (RoPE rotates pairs), not {self.qk_rope_head_dim}"
            )
        if self.q_lora_rank is not None:
            require_int(self.q_lora_rank, "q_lora_rank", low=1)
        require_real(self.rope_theta, "rope_theta", positive=True)
        require_int(self.seed, "seed", 0, MAX_SEED)

    @property
    def cached_values(self) -> int:
        """Values one token adds to one layer's cache: the latent plus the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE on the last dimension of x (batch, seq, [heads,] dim) at (seq,) positions (Llama's pairing)."""
    angles = positions.float()[:, None] * rotary_inv_freq(x.shape[-1], theta)  # (seq, dim / 2)
    angles = torch.cat([angles, angles], dim=-1)  # (seq, dim)
    if x.dim() == 4:
        angles = angles[:, None]  # (seq, 1, dim): one angle for every head
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * angles.cos() + rotated * angles.sin()


class MLACache:
    """Per layer, the cached latents (batch, seq, kv_lora_rank) and rotary keys (batch, seq, rope_dim)."""

    def __init__(self, num_layers: int):
        self.latents: list[torch.Tensor | None] = [None] * num_layers
        self.rope_keys: list[torch.Tensor | None] = [None] * num_layers

    @property
    def seq_len(self) -> int:
        """Tokens cached so far (layer 0's)."""
        return 0 if self.latents[0] is None else self.latents[0].shape[1]

    def append(self, layer: int, latent: torch.Tensor, rope_key: torch.Tensor):
        """Add the new tokens' latent and rotary key to ``layer``; return the whole history of both."""
        if self.latents[layer] is not None:
            latent = torch.cat([self.latents[layer], latent], dim=1)
            rope_key = torch.cat([self.rope_keys[layer], rope_key], dim=1)
        self.latents[layer], self.rope_keys[layer] = latent, rope_key
        return latent, rope_key

    def num_bytes(self) -> int:
        """Bytes the cache holds: every layer's latents and rotary keys."""
        tensors = [t for t in self.latents + self.rope_keys if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


class MLAAttention(nn.Module):
    """One MLA layer: low-rank queries, a cached latent plus a shared rotary key, two decode forms."""

    def __init__(self, config: MLAConfig):
        super().__init__()
        self.config = c = config
        qk_dim = c.qk_nope_head_dim + c.qk_rope_head_dim
        if c.q_lora_rank is None:
            self.wq = nn.Linear(c.hidden_size, c.num_heads * qk_dim, bias=False)
        else:
            self.wq_a = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(c.q_lora_rank)
            self.wq_b = nn.Linear(c.q_lora_rank, c.num_heads * qk_dim, bias=False)
        self.wkv_a = nn.Linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(c.kv_lora_rank)
        self.wkv_b = nn.Linear(c.kv_lora_rank, c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.wo = nn.Linear(c.num_heads * c.v_head_dim, c.hidden_size, bias=False)
        self.scale = qk_dim**-0.5

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK (heads, nope_dim, rank) and W_UV (heads, v_dim, rank), views of wkv_b's weight."""
        c = self.config
        w = self.wkv_b.weight.view(c.num_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        return w[:, : c.qk_nope_head_dim], w[:, c.qk_nope_head_dim :]

    def queries(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q_nope (batch, seq, heads, nope_dim) and the rotated q_rope (batch, seq, heads, rope_dim)."""
        c = self.config
        q = self.wq(x) if c.q_lora_rank is None else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(*x.shape[:2], c.num_heads, -1)  # (batch, seq, heads, nope_dim + rope_dim)
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        return q_nope, _rotate(q_rope, positions, c.rope_theta)

    def forward(self, x: torch.Tensor, cache: MLACache, layer: int, absorbed: bool) -> torch.Tensor:
        """x (batch, seq, hidden) of the new tokens -> (batch, seq, hidden); caches their latents."""
        c, past = self.config, cache.latents[layer]
        start = 0 if past is None else past.shape[1]
        positions = torch.arange(start, start + x.shape[1])  # (seq,)
        q_nope, q_rope = self.queries(x, positions)
        latent, rope_key = self.wkv_a(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent, rope_key = cache.append(
            layer, self.kv_norm(latent), _rotate(rope_key, positions, c.rope_theta)
        )
        # latent (batch, ctx, rank), rope_key (batch, ctx, rope_dim)
        mask = torch.arange(latent.shape[1])[None, :] > positions[:, None]  # (seq, ctx): the future
        attend = self._absorbed if absorbed else self._expanded
        out = attend(q_nope, q_rope, latent, rope_key, mask)  # (batch, seq, heads, v_dim)
        return self.wo(out.flatten(2))

    def _expanded(self, q_nope, q_rope, latent, rope_key, mask):
        """Per-head K/V up-projected from every cached latent, then multi-head attention."""
        c = self.config
        kv = self.wkv_b(latent).view(*latent.shape[:2], c.num_heads, -1)  # (batch, ctx, heads, nope + v)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        scores = torch.einsum("bshd,bthd->bhst", q_nope, k_nope)  # (batch, heads, seq, ctx)
        scores = scores + torch.einsum("bshd,btd->bhst", q_rope, rope_key)
        probs = torch.softmax((scores * self.scale).masked_fill(mask, float("-inf")), dim=-1)
        return torch.einsum("bhst,bthd->bshd", probs, v)

    def _absorbed(self, q_nope, q_rope, latent, rope_key, mask):
        """W_UK folded into the query, W_UV into the output: MQA over the latent, no per-head K/V."""
        w_uk, w_uv = self.up_weights()  # (heads, nope_dim, rank), (heads, v_dim, rank)
        q_latent = torch.einsum("bshd,hdr->bshr", q_nope, w_uk)  # (batch, seq, heads, rank)
        scores = torch.einsum("bshr,btr->bhst", q_latent, latent)  # (batch, heads, seq, ctx)
        scores = scores + torch.einsum("bshd,btd->bhst", q_rope, rope_key)
        probs = torch.softmax((scores * self.scale).masked_fill(mask, float("-inf")), dim=-1)
        out_latent = torch.einsum("bhst,btr->bshr", probs, latent)  # (batch, seq, heads, rank)
        return torch.einsum("bshr,hdr->bshd", out_latent, w_uv)  # (batch, seq, heads, v_dim)


class MLABlock(nn.Module):
    """A pre-norm decoder layer: MLA attention, then a SiLU MLP, each with a residual."""

    def __init__(self, config: MLAConfig):
        super().__init__()
        self.attn_norm, self.attn = nn.RMSNorm(config.hidden_size), MLAAttention(config)
        self.mlp_norm = nn.RMSNorm(config.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(config.hidden_size, 4 * config.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * config.hidden_size, config.hidden_size, bias=False),
        )

    def forward(self, x, cache: MLACache, layer: int, absorbed: bool):
        """x (batch, seq, hidden) -> the same shape, through attention then the MLP."""
        x = x + self.attn(self.attn_norm(x), cache, layer, absorbed)
        return x + self.mlp(self.mlp_norm(x))


class TinyMLA(nn.Module):
    """A small decoder of MLA layers with seeded random weights (chapter 9's model)."""

    def __init__(self, config: MLAConfig | None = None):
        super().__init__()
        self.config = config = config or MLAConfig()
        if not isinstance(config, MLAConfig):
            raise KVLibError(f"config must be an MLAConfig, not {type(config).__name__}")
        with seeded_weights(config.seed):
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList(MLABlock(config) for _ in range(config.num_layers))
            self.norm = nn.RMSNorm(config.hidden_size)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.eval()

    def new_cache(self) -> MLACache:
        """An empty latent cache for this model's layers."""
        return MLACache(self.config.num_layers)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: MLACache, absorbed: bool = True) -> torch.Tensor:
        """tokens (batch, seq) after the cached ones -> logits (batch, seq, vocab)."""
        x = self.embed(tokens)  # (batch, seq, hidden)
        for i, block in enumerate(self.layers):
            x = block(x, cache, i, absorbed)
        return self.lm_head(self.norm(x))

    def generate(self, prompt: torch.Tensor, num_new_tokens: int, absorbed: bool = True) -> list[int]:
        """Greedy tokens after a (1, seq) prompt; prefill and decode in the same form."""
        require_int(num_new_tokens, "num_new_tokens", low=1)
        if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[0] != 1:
            raise KVLibError("prompt must be a (1, seq) tensor of token ids")
        if prompt.dtype != torch.long or int(prompt.min()) < 0 or int(prompt.max()) >= self.config.vocab_size:
            raise KVLibError(f"prompt must hold integer token ids in [0, {self.config.vocab_size})")
        cache, tokens = self.new_cache(), []
        logits = self(prompt, cache, absorbed)
        for _ in range(num_new_tokens):
            tokens.append(int(logits[0, -1].argmax()))
            if len(tokens) < num_new_tokens:
                logits = self(torch.tensor([[tokens[-1]]]), cache, absorbed)
        return tokens
