"""Tests of kvlib.model.attention: grouped, repeat-K/V and SDPA attention agree with textbook attention."""

import pytest
import torch

from kvlib.model.attention import grouped_attention, repeat_kv_attention, sdpa_attention


def _qkv(heads, kv_heads, num_new, num_keys, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, num_new, 16, generator=g)
    k, v = (torch.randn(2, kv_heads, num_keys, 16, generator=g) for _ in range(2))
    return q, k, v


def _reference(q, k, v, q_start):
    """Textbook attention, one head at a time, with K/V head h // group."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for h in range(q.shape[1]):
        scores = q[:, h] @ k[:, h // group].transpose(-1, -2) / 4.0  # sqrt(16)
        pos = torch.arange(q.shape[2])[:, None] + q_start
        scores = scores.masked_fill(torch.arange(k.shape[2])[None, :] > pos, float("-inf"))
        out[:, h] = torch.softmax(scores, -1) @ v[:, h // group]
    return out


@pytest.mark.parametrize("kv_heads", [8, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("num_new, q_start", [(1, 11), (5, 0), (4, 8)], ids=["decode", "prefill", "chunk"])
@pytest.mark.parametrize(
    "attention", [grouped_attention, repeat_kv_attention, sdpa_attention], ids=lambda f: f.__name__
)
def test_implementations_agree_with_the_textbook(attention, kv_heads, num_new, q_start):
    q, k, v = _qkv(8, kv_heads, num_new, q_start + num_new)
    assert torch.allclose(attention(q, k, v, q_start), _reference(q, k, v, q_start), atol=1e-5)
