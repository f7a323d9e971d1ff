"""A paged cache with sliding-window layers whose out-of-window blocks go back to the pool (chapter 10).

:class:`WindowedPagedCache` implements the model's cache protocol (:class:`~kvlib.model.config.KVCache`)
for :class:`~kvlib.model.llama.TinyLlama`: each layer has a window (``None``: full attention), applied
in :meth:`WindowedPagedCache.attend`, where the model hands its attention to the cache. The layers
with one window form a group with its own block tables in a
:class:`~kvlib.paged.hybrid_manager.HybridBlockManager`; as in vLLM's hybrid allocator the groups
have equal sizes and *share the memory of one pool*: storage tensor ``t`` holds layer ``t`` of every
group, so a block a window frees and another group takes is overwritten there. That makes freeing
testable: tokens decoded with freed blocks equal those with every block kept only because the
window masks the freed keys anyway (:func:`generate_windowed`). This cache runs a decode step with
plain PyTorch (gather, mask, softmax), not chapter 3's fused kernels: it is for equality, not speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import are_token_ids, require_int
from kvlib.kernels.shape_checks import check_heads, check_step
from kvlib.kernels.torch_gather import gather_blocks
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.hybrid_manager import HybridBlockManager, KVGroupSpec
from kvlib.paged.paged_cache import check_model_config


def window_groups(windows: Sequence[int | None]) -> tuple[list[KVGroupSpec], list[int], list[int]]:
    """Groups of layers by window (in order of first use), each layer's group and its storage index.

    Every group must have as many layers as the others: storage tensor ``t`` holds the ``t``-th
    layer of each group (vLLM shares one tensor between layers of different groups the same way).
    """
    if not isinstance(windows, list | tuple) or not windows:
        raise KVLibError(f"windows must be a non-empty list of windows (int or None), not {windows!r}"[:200])
    for window in windows:
        if window is not None:
            require_int(window, "a window (tokens, or None for full attention)")
    names = list(dict.fromkeys(windows))
    layer_group = [names.index(w) for w in windows]
    sizes = [layer_group.count(g) for g in range(len(names))]
    if len(set(sizes)) != 1:
        raise KVLibError(f"every window must cover as many layers as the others, not {sizes} for {names}")
    layer_index = [layer_group[:i].count(g) for i, g in enumerate(layer_group)]
    groups = [KVGroupSpec("full" if w is None else f"window {w}", sizes[0], w) for w in names]
    return groups, layer_group, layer_index


class WindowedPagedCache:
    """K/V in one pool shared by layer groups, ``(layers_per_group, num_blocks + 1, block_size, kv_heads,
    head_dim)``; the query at position ``p`` of a layer with window ``w`` sees keys ``p - w + 1 .. p``.

    ``allocator_windows`` (default: ``windows``) are the windows the block manager frees by: a
    window smaller than the attention's frees blocks the attention still reads (a control, chapter 10).
    """

    def __init__(
        self,
        config: ModelConfig,
        windows: Sequence[int | None],
        num_blocks: int,
        block_size: int,
        free_out_of_window: bool = True,
        allocator_windows: Sequence[int | None] | None = None,
    ):
        check_model_config(config)
        window_groups(windows)  # a list of windows, each None or a positive integer
        if allocator_windows is not None:
            window_groups(allocator_windows)
        windows = list(windows)
        if len(windows) != config.num_layers:
            raise KVLibError(f"windows has {len(windows)} entries for {config.num_layers} layers")
        allocator_windows = windows if allocator_windows is None else list(allocator_windows)
        groups, self.layer_group, self.layer_index = window_groups(windows)
        if len(allocator_windows) != len(windows) or window_groups(allocator_windows)[1] != self.layer_group:
            raise KVLibError("allocator_windows must group the layers as windows does")
        self.windows = windows
        alloc_groups = window_groups(allocator_windows)[0]
        self.manager = HybridBlockManager(alloc_groups, num_blocks, block_size, free_out_of_window)
        self.num_groups = len(groups)
        shape = (groups[0].num_layers, num_blocks + 1, block_size, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape)  # (layers per group, blocks, block_size, kv_heads, head_dim)
        self.v = torch.zeros(shape)
        self.num_layers = config.num_layers
        self._batch: list[int] = []
        self._pass: dict | None = None

    def schedule(self, seq_ids: Sequence[int]) -> None:
        """Choose the sequences (in batch order) of the next forward pass."""
        if not isinstance(seq_ids, list | tuple | range):
            raise KVLibError(f"seq_ids must be a list of sequence ids, not {type(seq_ids).__name__}")
        if not seq_ids or len(set(seq_ids)) != len(seq_ids):
            raise KVLibError(f"schedule needs distinct sequences, not {list(seq_ids)}"[:200])
        for seq_id in seq_ids:
            self.manager.num_tokens(seq_id)  # raises for an unknown or freed sequence
        self._batch = list(seq_ids)

    def prepare(self, num_new: int) -> torch.Tensor:
        """Positions (batch, num_new) of the scheduled sequences' tokens without K/V; slots per group."""
        if not self._batch:
            raise KVLibError("no sequences scheduled: call cache.schedule(seq_ids) before running the model")
        num_new = require_int(num_new, "num_new")
        manager = self.manager
        starts = [manager.num_computed(s) for s in self._batch]
        for seq_id, start in zip(self._batch, starts, strict=True):
            if manager.num_tokens(seq_id) - start != num_new:
                raise KVLibError(
                    f"sequence {seq_id} has {manager.num_tokens(seq_id) - start} tokens without K/V"
                )
        slots, tables = [], []
        for g in range(self.num_groups):
            slots.append(
                torch.tensor(
                    [
                        manager.slot(s, g, p)
                        for s, st in zip(self._batch, starts, strict=True)
                        for p in range(st, st + num_new)
                    ]
                )
            )
            rows = [manager.block_table(s, g) for s in self._batch]
            width = max(map(len, rows))
            tables.append(
                torch.tensor([row + [0] * (width - len(row)) for row in rows])
            )  # (batch, max_blocks)
        positions = torch.tensor([[st + i for i in range(num_new)] for st in starts])  # (batch, num_new)
        self._pass = {
            "slots": slots,
            "tables": tables,
            "positions": positions,
            "ends": [st + num_new for st in starts],
        }
        return positions

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write this layer's new K/V into its group's slots, then attend within the layer's window.

        q: (batch, num_heads, num_new, head_dim); k, v: (batch, num_kv_heads, num_new, head_dim)
        returns: (batch, num_heads, num_new, head_dim)
        """
        if self._pass is None:
            raise KVLibError("attend before prepare: schedule, then prepare")
        num_new = self._pass["positions"].shape[1]
        check_step(
            layer, self.num_layers, q, k, v, (len(self._batch), self.k.shape[3], num_new, self.k.shape[4])
        )
        for name, tensor in (("q", q), ("k", k), ("v", v)):
            if tensor.dtype != self.k.dtype or tensor.device != self.k.device:
                raise KVLibError(
                    f"{name} must be {self.k.dtype} on {self.k.device} like the cache, "
                    f"not {tensor.dtype} on {tensor.device}"
                )
        group, index = self.layer_group[layer], self.layer_index[layer]
        batch, num_heads, num_new, head_dim = q.shape
        num_kv_heads = k.shape[1]
        flat = (-1, num_kv_heads, head_dim)  # one row per slot
        slots = self._pass["slots"][group]
        self.k[index].view(flat)[slots] = k.transpose(1, 2).reshape(flat)  # (batch * new, kv_heads, hd)
        self.v[index].view(flat)[slots] = v.transpose(1, 2).reshape(flat)
        table = self._pass["tables"][group]
        keys = gather_blocks(self.k[index], table).transpose(1, 2)  # (batch, kv_heads, num_keys, hd)
        values = gather_blocks(self.v[index], table).transpose(1, 2)
        visible = window_mask(self._pass["positions"], keys.shape[2], self.windows[layer])
        out = masked_attention(q, keys, values, visible)  # (batch, heads, new, hd)
        if layer == self.num_layers - 1:  # the pass is complete: mark computed, windows free blocks
            for seq_id, end in zip(self._batch, self._pass["ends"], strict=True):
                self.manager.mark_computed(seq_id, end)
            self._pass = None
        return out


def window_mask(positions: torch.Tensor, num_keys: int, window: int | None) -> torch.Tensor:
    """True where the query at ``positions`` (batch, num_new) may see key j: j <= p, and j > p - window.

    returns: (batch, num_new, num_keys)
    """
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.dtype.is_floating_point:
        shape = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise KVLibError(f"positions must be a (batch, num_new) integer tensor, not {shape}")
    require_int(num_keys, "num_keys", low=0)
    if window is not None:
        require_int(window, "window")
    keys = torch.arange(num_keys)[None, None, :]  # (1, 1, num_keys)
    p = positions[:, :, None]  # (batch, num_new, 1)
    visible = keys <= p
    if window is not None:
        visible &= keys > p - window
    return visible


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Attention of q (batch, heads, new, hd) over k, v (batch, kv_heads, keys, hd) where ``visible``
    (batch, new, keys) allows, each K/V head serving a group of query heads; (batch, heads, new, hd)."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise KVLibError(f"{name} must be a 4-d tensor (batch, heads, length, head_dim), not {shape}")
    if k.shape != v.shape or k.shape[0] != q.shape[0]:
        raise KVLibError(
            f"k and v must share one shape and q's batch, not {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_heads(q.shape[1], q.shape[3], k.shape[1], k.shape[3])
    expected = (q.shape[0], q.shape[2], k.shape[2])
    if (
        not isinstance(visible, torch.Tensor)
        or visible.dtype != torch.bool
        or tuple(visible.shape) != expected
    ):
        shape = tuple(visible.shape) if isinstance(visible, torch.Tensor) else type(visible).__name__
        raise KVLibError(
            f"visible must be a (batch, num_new, num_keys) = {expected} bool tensor, not {shape}"
        )
    batch, num_heads, num_new, head_dim = q.shape
    num_kv_heads, num_keys = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    q = q.reshape(batch, num_kv_heads, group * num_new, head_dim)
    scores = (q @ k.transpose(-1, -2)) / head_dim**0.5  # (batch, kv_heads, group * new, keys)
    scores = scores.view(batch, num_kv_heads, group, num_new, num_keys)
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).view(batch, num_kv_heads, group * num_new, num_keys)
    return (weights @ v).view(batch, num_heads, num_new, head_dim)


@dataclass
class WindowedRun:
    """Result of :func:`generate_windowed`."""

    tokens: list[list[int]]  # per sequence: prompt, then the generated tokens
    peak_blocks: int  # most blocks in use at once
    num_window_frees: int  # blocks the windows gave back during the run


@torch.inference_mode()
def generate_windowed(
    model: TinyLlama,
    prompts: Sequence[Sequence[int]],
    num_new: int,
    windows: Sequence[int | None],
    block_size: int,
    num_blocks: int,
    free_out_of_window: bool = True,
    allocator_windows: Sequence[int | None] | None = None,
) -> WindowedRun:
    """Greedy generation of ``num_new`` tokens per prompt on a :class:`WindowedPagedCache`: each prompt
    prefilled alone, then all decoded together, one token per step."""
    if not isinstance(model, TinyLlama):
        raise KVLibError(f"model must be a kvlib TinyLlama, not {type(model).__name__}")
    if not isinstance(prompts, list | tuple) or not prompts:
        raise KVLibError(f"prompts must be a non-empty list of token-id lists, not {prompts!r}"[:200])
    for prompt in prompts:
        if not are_token_ids(prompt) or not prompt or max(prompt) >= model.config.vocab_size:
            raise KVLibError(
                f"each prompt must be a non-empty list of token ids in 0..{model.config.vocab_size - 1}, "
                f"not {prompt!r}"[:200]
            )
    require_int(num_new, "num_new")
    cache = WindowedPagedCache(
        model.config, windows, num_blocks, block_size, free_out_of_window, allocator_windows
    )
    manager, tokens, peak = cache.manager, [list(p) for p in prompts], 0
    for seq_id, seq_tokens in enumerate(tokens):
        if not manager.allocate(seq_id, len(seq_tokens)):
            raise KVLibError(f"the pool of {num_blocks} blocks cannot hold prompt {seq_id}")
        peak = max(peak, manager.num_used_blocks)
        cache.schedule([seq_id])
        logits = model(torch.tensor([seq_tokens]), cache, last_only=True)  # (1, 1, vocab)
        seq_tokens.append(int(logits[0, -1].argmax()))
    seq_ids = list(range(len(tokens)))
    for _ in range(num_new - 1):
        for seq_id in seq_ids:
            if not manager.append_slots(seq_id):
                raise KVLibError(f"the pool of {num_blocks} blocks is full")
        peak = max(peak, manager.num_used_blocks)
        cache.schedule(seq_ids)
        newest = torch.tensor([[t[-1]] for t in tokens])  # (batch, 1)
        next_tokens = model(newest, cache, last_only=True)[:, -1].argmax(-1).tolist()  # (batch,)
        for seq_tokens, token in zip(tokens, next_tokens, strict=True):
            seq_tokens.append(token)
    return WindowedRun(tokens, peak, manager.num_window_frees)
