"""Fewer K/V heads after training: a multi-head model converted to GQA or MQA (chapter 7).

A model trained with ``num_kv_heads`` K/V heads can be given fewer, g, without training
from scratch: the GQA paper (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
Transformer Models from Multi-Head Checkpoints", Sections 2.1-2.2) splits the K/V heads into g
groups of consecutive heads and builds each group's one new K and V projection by
mean-pooling the projection matrices of the heads in it; the model is then uptrained for a
few percent of its pre-training steps. Its ablation (Figure 4) compares mean-pooling with
keeping the first head of each group and with fresh random heads: mean-pooling is best,
keeping one head next. :func:`pool_kv_heads` does both conversions on a
:class:`~kvlib.model.llama.TinyLlama`; chapter 7 (What a smaller cache
costs) converts the project's trained MHA model to GQA and MQA with it, before and after uptraining,
and sets perplexity against the KV bytes saved (g / num_kv_heads of the cache).

Grouping follows :func:`~kvlib.model.attention.grouped_attention`: query head i reads K/V head
i // (num_heads / num_kv_heads), so the query heads that read old heads j r .. j r + r - 1
(r = num_kv_heads / g) all read new head j: the query side needs no change.

What holds exactly (up to float32 rounding), and why: a projection is linear, so the mean of
the heads' rows applied to x is the mean of the heads' K (and V) of x; rotary positions rotate
every head of a token by the same angles, a linear map too, so pooled keys are the mean of the
rotated keys at every position. Hence the first layer's cached K/V are the group means of the
original model's. From the first attention output on they differ: softmax over the mean key is
not the mean of the softmaxes, which is what uptraining repairs.
"""

from __future__ import annotations

import dataclasses

import torch

from kvlib import KVLibError
from kvlib.checks import is_int, require_int
from kvlib.model.llama import TinyLlama

POOLING_METHODS = ("mean", "keep")  # mean of each group's heads (the GQA paper), or one head kept per group


def check_pooled_heads(num_kv_heads, current: int) -> None:
    """Raise a one-line :class:`~kvlib.KVLibError` unless ``num_kv_heads`` can replace ``current`` heads.

    It must be a positive integer (not a bool), at most ``current`` (pooling only removes heads),
    and divide ``current``, so that every group holds the same number of heads.
    """
    if not is_int(num_kv_heads) or num_kv_heads < 1:
        raise KVLibError(f"num_kv_heads must be a positive integer, not {num_kv_heads!r}")
    if num_kv_heads > current:
        raise KVLibError(
            f"num_kv_heads ({num_kv_heads}) exceeds the model's {current} K/V heads: "
            "pooling only removes heads"
        )
    if current % num_kv_heads:
        raise KVLibError(
            f"num_kv_heads ({num_kv_heads}) must divide the model's {current} K/V heads "
            "so that every group holds as many heads"
        )


def check_pooling_method(method, kept_head, group_size: int) -> None:
    """Raise a one-line :class:`~kvlib.KVLibError` unless ``method`` and ``kept_head`` are usable.

    ``kept_head`` is the head kept within each group of ``group_size`` heads (method ``"keep"``
    only): an integer from 0 (the GQA paper's "first") to ``group_size - 1``.
    """
    if method not in POOLING_METHODS:
        raise KVLibError(f"method must be one of {', '.join(POOLING_METHODS)}, not {method!r}")
    require_int(kept_head, "kept_head", low=None)
    if method == "mean" and kept_head != 0:
        raise KVLibError(f"kept_head ({kept_head}) applies to method 'keep' only, not 'mean'")
    if not 0 <= kept_head < group_size:
        raise KVLibError(f"kept_head must be from 0 to {group_size - 1} (heads per group), not {kept_head}")


def pooled_rows(
    weight: torch.Tensor, num_kv_heads: int, head_dim: int, method: str = "mean", kept_head: int = 0
) -> torch.Tensor:
    """A k_proj or v_proj weight (old_heads * head_dim, d_model) -> (num_kv_heads * head_dim, d_model).

    Rows head_dim h .. head_dim (h + 1) - 1 are head h's. New head j is made from old heads
    j r .. j r + r - 1 (r = old_heads / num_kv_heads): their mean, row by row ("mean"), or head
    j r + kept_head ("keep"). The mean is taken in at least float32 and cast back to the
    weight's dtype. A new tensor, never a view of ``weight``.
    """
    old_heads = weight.shape[0] // head_dim
    group_size = old_heads // num_kv_heads
    heads = weight.detach().reshape(num_kv_heads, group_size, head_dim, weight.shape[1])
    if method == "mean":
        acc = torch.promote_types(weight.dtype, torch.float32)
        new = heads.to(acc).mean(dim=1).to(weight.dtype)  # (num_kv_heads, head_dim, d_model)
    else:
        new = heads[:, kept_head].clone()  # (num_kv_heads, head_dim, d_model)
    return new.reshape(num_kv_heads * head_dim, weight.shape[1])


def pool_kv_heads(model: TinyLlama, num_kv_heads: int, method: str = "mean", kept_head: int = 0) -> TinyLlama:
    """A new :class:`~kvlib.model.llama.TinyLlama` like ``model`` with ``num_kv_heads`` K/V heads.

    Every layer's k_proj and v_proj are :func:`pooled_rows` of the original's (``method``
    ``"mean"``: the GQA paper's mean-pooling; ``"keep"``: head ``kept_head`` of each group);
    every other weight is a copy. The config is the original's with ``num_kv_heads`` replaced
    (so its seed is kept), and no weight is drawn: the model is built on the meta device and
    given the converted tensors, on ``model``'s device and in its dtype, with each parameter's
    ``requires_grad`` and the training mode copied, and of ``model``'s class (a
    :class:`~kvlib.model.lean.LeanLlama` gives one whose lean pass fuses its own weights on first
    use). ``model`` is untouched. The same number of heads
    gives an exact copy. Bad arguments raise a one-line :class:`~kvlib.KVLibError`.
    """
    if not isinstance(model, TinyLlama):
        raise KVLibError(f"model must be a kvlib TinyLlama, not {type(model).__name__}")
    config = model.config
    check_pooled_heads(num_kv_heads, config.num_kv_heads)
    check_pooling_method(method, kept_head, config.num_kv_heads // num_kv_heads)
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    for i, block in enumerate(model.layers):
        for proj in ("k_proj", "v_proj"):
            weight = getattr(block.self_attn, proj).weight
            state[f"layers.{i}.self_attn.{proj}.weight"] = pooled_rows(
                weight, num_kv_heads, config.head_dim, method, kept_head
            )
    with torch.device("meta"):  # shapes only: nothing drawn, nothing allocated
        pooled = TinyLlama(dataclasses.replace(config, num_kv_heads=num_kv_heads))
    pooled.load_state_dict(state, assign=True)  # strict: every parameter replaced, none left on meta
    old_params = dict(model.named_parameters())
    for name, param in pooled.named_parameters():
        param.requires_grad_(old_params[name].requires_grad)
    pooled.train(model.training)
    return pooled if type(model) is TinyLlama else type(model).sharing(pooled)  # a LeanLlama stays lean
