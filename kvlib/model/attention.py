"""Scaled dot-product attention with grouped key/value heads (MHA, GQA and MQA in one function).

With ``num_heads`` query heads and ``num_kv_heads`` key/value heads, each K/V head serves
a group of ``num_heads // num_kv_heads`` query heads. :func:`grouped_attention` computes
this without copying K and V once per query head: it folds each group's queries into
the row dimension of one matrix product against the shared K/V head. The models of
chapter 1 and the contiguous caches of :mod:`kvlib.cache.contiguous` use it for every
forward pass; chapter 2 (:mod:`kvlib.chapters.ch02_cache_size.decode_speed`) measures it against the two usual
alternatives, :func:`repeat_kv_attention` and :func:`sdpa_attention`.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int | torch.Tensor = 0
) -> torch.Tensor:
    """Causal attention of new queries over all stored keys, K/V shared by groups of heads.

    q: (batch, num_heads, num_new, head_dim): the queries of the tokens being processed
    k, v: (batch, num_kv_heads, num_keys, head_dim): every key/value the queries may see
    q_start: position of the first query among the keys (an int, or one per sequence as a
        (batch,) tensor); query i may attend to keys 0 .. q_start + i. Keys beyond a
        sequence's own length must be masked by the caller or absent.
    returns: (batch, num_heads, num_new, head_dim)
    """
    batch, num_heads, num_new, head_dim = q.shape
    num_kv_heads, num_keys = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    # Fold each group's query heads into rows: (batch, kv_heads, group * num_new, head_dim).
    q = q.reshape(batch, num_kv_heads, group * num_new, head_dim)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)  # (batch, kv_heads, group * num_new, num_keys)
    scores = scores.view(batch, num_kv_heads, group, num_new, num_keys)  # each group's rows apart
    if num_new > 1 or not isinstance(q_start, int):  # one query at the end of its keys needs no mask
        scores = scores.masked_fill(~causal_mask(q_start, num_new, num_keys, q.device), float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)  # (batch, kv_heads, group, num_new, num_keys)
    weights = weights.view(batch, num_kv_heads, group * num_new, num_keys)
    out = weights @ v  # (batch, kv_heads, group * num_new, head_dim)
    return out.view(batch, num_heads, num_new, head_dim)


def causal_mask(q_start: int | torch.Tensor, num_new: int, num_keys: int, device) -> torch.Tensor:
    """True where query i (at position q_start + i) may see key j, i.e. j <= q_start + i.

    Shape (num_new, num_keys) for an int ``q_start``; (batch, 1, 1, num_new, num_keys) for
    a per-sequence tensor, ready to broadcast over (batch, kv_heads, group, new, keys).
    """
    query_pos = torch.arange(num_new, device=device)[:, None]  # (num_new, 1)
    key_pos = torch.arange(num_keys, device=device)[None, :]  # (1, num_keys)
    if isinstance(q_start, int):
        return key_pos <= query_pos + q_start  # (num_new, num_keys)
    starts = q_start.to(device).view(-1, 1, 1)  # (batch, 1, 1)
    return (key_pos <= query_pos + starts)[:, None, None]  # (batch, 1, 1, num_new, num_keys)


def repeat_kv_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int | torch.Tensor = 0
) -> torch.Tensor:
    """The common alternative to :func:`grouped_attention`: copy each K/V head once per query head.

    Same arguments and result as :func:`grouped_attention`, but K and V are expanded with
    ``repeat_interleave`` to ``num_heads`` heads first (what many model ports do, e.g. a
    ``repeat_kv`` helper). The copy writes ``group`` times the cache and the attention
    then reads it back, so a GQA/MQA model pays MHA's memory traffic and more; chapter 2
    measures the cost.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (batch, num_heads, num_keys, head_dim): a fresh copy
    v = v.repeat_interleave(group, dim=1)  # (batch, num_heads, num_keys, head_dim): another
    return grouped_attention(q, k, v, q_start)  # (batch, num_heads, num_new, head_dim), group of 1


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int = 0) -> torch.Tensor:
    """Attention by ``torch.nn.functional.scaled_dot_product_attention`` with ``enable_gqa=True``.

    PyTorch's fused kernel broadcasts grouped K/V heads itself. ``q_start`` must be an
    int here: one query (decode, chapter 2) needs no mask; several queries get the same
    causal mask as :func:`grouped_attention`.
    """
    num_new, num_keys = q.shape[2], k.shape[2]
    mask = None if num_new == 1 else causal_mask(q_start, num_new, num_keys, q.device)  # (num_new, num_keys)
    # q (batch, num_heads, num_new, head_dim); k, v (batch, num_kv_heads, num_keys, head_dim)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # like q
