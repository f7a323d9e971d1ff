"""The PyTorch reference of paged attention: gather a sequence's blocks through its block table,
then attend (chapter 3; the oracle the fused kernels of chapters 2 and 3 are tested against).

One layer's K/V pool is shaped ``(num_blocks, block_size, num_kv_heads, head_dim)`` as in
vLLM. :func:`paged_attention` is the kernel: it gathers each sequence's blocks in
block-table order (:func:`gather_blocks`: one copy of the K/V it reads, which vLLM's CUDA
kernel, and :mod:`kvlib.kernels.numba_decode` and :mod:`kvlib.kernels.triton_decode`, avoid by
reading the blocks in place) and attends with each K/V head shared by its group of query heads
(:func:`attend_gathered`), as :func:`kvlib.model.attention.grouped_attention` does for the
contiguous cache. :func:`key_mask` hides the keys a query may not see.
:class:`kvlib.paged.paged_cache.PagedKVCache` calls it for prefills (several new tokens per
sequence); :mod:`kvlib.chapters.ch03_paged_attention.kernel_overhead` checks that it equals contiguous
attention and
measures what the gather costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib.kernels.shape_checks import check_batch, check_heads
from kvlib.units import ceil_div


class GatherBuffer:
    """Memory that :func:`gather_blocks` reuses from call to call, grown when a call needs more.

    A kernel that allocates a fresh multi-MiB tensor at every decode step makes a CPU's
    operating system hand out (and zero-fill) new pages each time, which can cost more than
    the copy itself. GPU allocators cache memory, but reuse does no harm there.
    """

    def __init__(self):
        self._memory: torch.Tensor | None = None

    def view(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor of ``shape`` with ``like``'s dtype and device, backed by the buffer."""
        numel = math.prod(shape)
        memory = self._memory  # (capacity,) flat, or None before the first call
        if (
            memory is None
            or memory.numel() < numel
            or memory.dtype != like.dtype
            or memory.device != like.device
        ):
            memory = self._memory = torch.empty(numel, dtype=like.dtype, device=like.device)
        return memory[:numel].view(shape)  # (capacity,) -> (numel,) -> shape


def gather_blocks(
    cache: torch.Tensor, block_tables: torch.Tensor, buffer: GatherBuffer | None = None
) -> torch.Tensor:
    """Read whole blocks of one layer's pool in block-table order (one gather, one copy).

    cache: (num_blocks, block_size, num_kv_heads, head_dim); block_tables: (batch, max_blocks)
    returns: (batch, max_blocks * block_size, num_kv_heads, head_dim): row j of a sequence holds
    its token j (rows past a sequence's length hold whatever their block holds). With a
    ``buffer``, the result lives in it (and is overwritten by the buffer's next use).
    """
    batch, max_blocks = block_tables.shape
    _, block_size, num_kv_heads, head_dim = cache.shape
    index = block_tables.flatten()  # (batch * max_blocks,)
    if buffer is None:
        blocks = cache.index_select(0, index)  # (batch * max_blocks, block_size, kv_heads, head_dim)
    else:
        blocks = torch.index_select(  # the same, written into the buffer
            cache, 0, index, out=buffer.view((index.numel(), *cache.shape[1:]), cache)
        )
    # (batch * max_blocks, block_size, kv_heads, head_dim) -> (batch, max_blocks * block_size, kv_heads, hd)
    return blocks.view(batch, max_blocks * block_size, num_kv_heads, head_dim)


def visibility_bias(seq_lens: torch.Tensor, num_new: int, num_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """0 where a query may see a key, -inf where it may not: (batch, num_new, num_keys).

    Query i of a sequence of ``seq_len`` tokens sits at position ``seq_len - num_new + i``
    and sees keys 0 up to that position; keys past it are later tokens, or padding up to
    the longest sequence of the batch. Adding the bias to the scores hides them: one
    broadcast addition, cheaper than applying a boolean mask of the scores' full size.
    """
    device = seq_lens.device
    last_visible = (seq_lens - num_new)[:, None] + torch.arange(num_new, device=device)  # (batch, num_new)
    # (num_keys,) <= (batch, num_new, 1) -> (batch, num_new, num_keys) bool
    visible = torch.arange(num_keys, device=device) <= last_visible[..., None]
    return torch.where(  # (batch, num_new, num_keys) of 0 and -inf
        visible,
        torch.zeros((), dtype=dtype, device=device),
        torch.full((), float("-inf"), dtype=dtype, device=device),
    )


@dataclass(frozen=True)
class KeyMask:
    """Which keys the queries of one forward pass see; the same for every layer, so computed once."""

    num_keys: int  # keys read per sequence: the longest sequence's length
    bias: torch.Tensor | None  # (batch, num_new, num_keys) from visibility_bias; None: all keys visible


def key_mask(
    seq_lens: torch.Tensor,
    num_new: int,
    dtype: torch.dtype = torch.float32,
    lengths: Sequence[int] | None = None,
) -> KeyMask:
    """The :class:`KeyMask` of sequences of ``seq_lens`` tokens whose ``num_new`` newest are the queries.

    ``lengths``: the same lengths as Python ints, if the caller knows them (saves reading
    ``seq_lens`` back from the device). Single-token steps over sequences of one length
    need no mask at all.
    """
    lengths = seq_lens.tolist() if lengths is None else lengths  # (batch,) as ints
    num_keys = max(lengths)
    if num_new == 1 and min(lengths) == num_keys:
        return KeyMask(num_keys, None)
    return KeyMask(num_keys, visibility_bias(seq_lens, num_new, num_keys, dtype))


QUERY_CHUNK = 128  # queries of one sequence per pass in a long prefill (see paged_attention)


def attend_gathered(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    scores_buffer: GatherBuffer | None = None,
) -> torch.Tensor:
    """Grouped attention of queries over gathered keys and values: the arithmetic of :func:`paged_attention`.

    q: (batch, num_kv_heads, group, num_new, head_dim); k, v: (batch, keys, num_kv_heads, head_dim)
    bias: (batch, num_new, keys) from :func:`visibility_bias`, or None if every query sees every key
    returns: (num_kv_heads, batch, group * num_new, head_dim)

    Each K/V head meets the queries of its group in two batched matrix products that read
    the gathered K and V in place (a strided matrix: no copy per query head) and write
    straight into one tensor of scores; the first also scales them.
    """
    batch, num_kv_heads, group, num_new, head_dim = q.shape
    num_keys = k.shape[1]
    q = q.reshape(batch, num_kv_heads, group * num_new, head_dim)  # each group's queries as rows
    shape = (num_kv_heads, batch, group * num_new, num_keys)
    scores = q.new_empty(shape) if scores_buffer is None else scores_buffer.view(shape, q)
    for h in range(num_kv_heads):  # scores[h] = q[:, h] @ k[:, :, h]^T / sqrt(head_dim)
        # (batch, group * new, hd) @ (batch, hd, keys) -> (batch, group * new, keys)
        torch.baddbmm(
            scores[h],
            q[:, h],
            k[:, :, h].transpose(1, 2),
            beta=0,
            alpha=1 / math.sqrt(head_dim),
            out=scores[h],
        )
    if bias is not None:  # (kv_heads, batch, group, new, keys) += (batch, 1, new, keys)
        scores.view(num_kv_heads, batch, group, num_new, num_keys).add_(bias[:, None])
    # float32 softmax, as for 16-bit caches: (kv_heads, batch, group * new, keys)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    out = q.new_empty(num_kv_heads, batch, group * num_new, head_dim)
    for h in range(
        num_kv_heads
    ):  # (batch, group * new, keys) @ (batch, keys, hd) -> (batch, group * new, hd)
        torch.bmm(weights[h], v[:, :, h], out=out[h])
    return out


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    buffers: tuple[GatherBuffer, ...] | None = None,
    mask: KeyMask | None = None,
) -> torch.Tensor:
    """Attention of each sequence's newest queries over its keys and values stored in blocks.

    q: (batch, num_heads, num_new, head_dim), the last ``num_new`` tokens of each sequence
    k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim), one layer's pool
    block_tables: (batch, max_blocks) int64, padded with any valid block id
    seq_lens: (batch,) tokens stored per sequence, the new ones included; they may differ
    buffers: optional reusable memory (see :class:`GatherBuffer`) for the gathered K and V,
        and optionally a third for the scores
    mask: optional :func:`key_mask` of ``seq_lens``, if the caller computed it for all layers
    returns: (batch, num_heads, num_new, head_dim)

    The blocks are gathered once in the pool's own token-major layout, and only as many
    keys as the longest sequence has are read; :func:`attend_gathered` does the rest. Keys a
    query may not see (later positions, or the padding of a shorter sequence) get -inf
    from the mask's bias before the softmax. A long prefill goes through its queries
    ``QUERY_CHUNK`` at a time, each chunk reading only the keys its last query sees: no
    scores for the hidden upper triangle, and a chunk's scores fit in the processor's cache.
    """
    batch, num_heads, num_new, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    check_batch(batch, block_tables.shape[0], seq_lens.shape[0])
    check_heads(num_heads, head_dim, num_kv_heads, k_cache.shape[3])
    group = num_heads // num_kv_heads
    mask = key_mask(seq_lens, num_new, q.dtype) if mask is None else mask
    num_keys = mask.num_keys
    # (batch, blocks the longest sequence needs): no more blocks than that are read
    tables = block_tables[:, : ceil_div(num_keys, k_cache.shape[1])]
    k_buffer, v_buffer, scores_buffer = (*(buffers or ()), None, None, None)[:3]  # K, V, optionally scores
    k = gather_blocks(k_cache, tables, k_buffer)[:, :num_keys]  # (batch, keys, kv_heads, head_dim)
    v = gather_blocks(v_cache, tables, v_buffer)[:, :num_keys]  # (batch, keys, kv_heads, head_dim)
    q = q.reshape(batch, num_kv_heads, group, num_new, head_dim)  # query heads grouped by their K/V head
    if num_new <= QUERY_CHUNK:
        out = attend_gathered(q, k, v, mask.bias, scores_buffer)  # (kv_heads, batch, group * new, head_dim)
        # -> (batch, kv_heads, group * new, hd) -> (batch, num_heads, new, hd)
        return out.transpose(0, 1).reshape(batch, num_heads, num_new, head_dim)
    out = q.new_empty(batch, num_kv_heads, group, num_new, head_dim)
    for start in range(0, num_new, QUERY_CHUNK):
        end = min(start + QUERY_CHUNK, num_new)
        keys = num_keys - (num_new - end)  # the chunk's last query sees no key past these
        part = attend_gathered(  # (kv_heads, batch, group * chunk, head_dim)
            q[:, :, :, start:end], k[:, :keys], v[:, :keys], mask.bias[:, start:end, :keys], scores_buffer
        )
        # (kv_heads, batch, group, chunk, hd) -> (batch, kv_heads, group, chunk, hd)
        out[:, :, :, start:end] = part.view(num_kv_heads, batch, group, end - start, head_dim).transpose(0, 1)
    # (batch, kv_heads, group, new, hd) -> (batch, num_heads, new, hd)
    return out.view(batch, num_heads, num_new, head_dim)
