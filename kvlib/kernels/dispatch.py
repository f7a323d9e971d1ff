"""One entry point for decode attention over a paged cache, whichever kernel runs it (chapters 2 and 3).

:func:`decode_attention` checks its inputs (one clear :class:`~kvlib.KVLibError` line for a
wrong shape, dtype, device or kernel name), picks the kernel (:func:`default_kernel`: numba
on the CPU, Triton on CUDA, the PyTorch gather reference where neither can run) and the
number of context splits (:func:`choose_num_splits`: Flash-Decoding's split-K when the
kernel's work items, :func:`work_items`, leave threads idle). :func:`contiguous_tables` and
:func:`as_blocks` run the same kernel on contiguous memory through an identity block table:
the baseline that paging's overhead is measured against. :func:`kernel_info` says which
kernel runs and what its compilation cost, so that every number can name its kernel.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import torch

from kvlib import KVLibError
from kvlib.kernels.shape_checks import check_batch, check_heads
from kvlib.kernels.torch_gather import paged_attention
from kvlib.units import ceil_div

KERNELS = ("torch", "numba", "triton")
MIN_SPLIT_TOKENS = 128  # fewest tokens per split: below, the merge costs more than the split buys
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.cache
def numba_module() -> ModuleType | None:
    """:mod:`kvlib.kernels.numba_decode`, imported on first use (numba takes a second to import),
    or None where numba cannot be imported (a platform without its wheels)."""
    if importlib.util.find_spec("numba") is None:
        return None
    try:
        import kvlib.kernels.numba_decode as numba_decode
    except ImportError:  # numba present but unusable (e.g. a numpy it does not support)
        return None
    return numba_decode


def triton_ready() -> bool:
    """Can the Triton kernel run here (Triton installed and a CUDA device present)?"""
    from kvlib.kernels.triton_decode import triton_available

    return triton_available()


def default_kernel(device: torch.device | str | None = None) -> str:
    """The kernel :func:`decode_attention` runs on ``device`` (default CPU) when none is named."""
    device = torch.device("cpu" if device is None else device)
    if device.type == "cpu":
        return "numba" if numba_module() is not None else "torch"
    if device.type == "cuda":
        return "triton" if triton_ready() else "torch"
    return "torch"


def num_workers(device: torch.device) -> int:
    """Parallel workers a kernel fills: numba's threads on the CPU, streaming multiprocessors on CUDA."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    if numba_module() is None:
        return torch.get_num_threads()
    from kvlib.kernels.numba_setup import numba_threads

    return numba_threads()


def work_items(kernel: str, batch: int, num_kv_heads: int) -> int:
    """Work items a kernel runs in parallel before any split of the context: the numba kernel
    takes one per sequence (it walks a block's memory in order, every KV head of a token side
    by side); the Triton kernel one per (sequence, KV head), as a GPU has many more cores."""
    return batch * num_kv_heads if kernel == "triton" else batch


def choose_num_splits(num_items: int, max_seq_len: int, num_workers: int) -> int:
    """Context splits per work item: 1 while the ``num_items`` (:func:`work_items`) fill the
    workers, else enough splits to give every worker one, each at least ``MIN_SPLIT_TOKENS``
    long (Flash-Decoding's split-K)."""
    if num_items >= num_workers:
        return 1
    return max(1, min(ceil_div(num_workers, num_items), max_seq_len // MIN_SPLIT_TOKENS))


def _check(q, k_cache, v_cache, block_tables, seq_lens, kernel) -> None:
    """Raise a one-line KVLibError for inputs no kernel accepts."""
    if kernel not in KERNELS:
        raise KVLibError(f"unknown kernel {kernel!r}: choose one of {KERNELS} (or None for the default)")
    if q.dim() != 3 or k_cache.dim() != 4:
        raise KVLibError(
            f"q must be (batch, num_heads, head_dim) and the caches (num_blocks, block_size, "
            f"num_kv_heads, head_dim), not {tuple(q.shape)} and {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise KVLibError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    if k_cache.dtype not in CACHE_DTYPES or q.dtype not in CACHE_DTYPES:
        raise KVLibError(f"caches and q must be float32, float16 or bfloat16, not {k_cache.dtype}, {q.dtype}")
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    check_heads(num_heads, head_dim, num_kv_heads, k_cache.shape[3])
    if block_tables.dim() != 2 or block_tables.dtype not in (torch.int32, torch.int64):
        raise KVLibError(f"block_tables must be (batch, max_blocks) int32 or int64, not {block_tables.dtype}")
    if seq_lens.dim() != 1 or seq_lens.dtype.is_floating_point or seq_lens.dtype == torch.bool:
        raise KVLibError(
            f"seq_lens must be a (batch,) integer tensor, not {seq_lens.dtype} {tuple(seq_lens.shape)}"
        )
    check_batch(batch, block_tables.shape[0], seq_lens.shape[0])
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, seq_lens)}
    if len(devices) > 1:
        raise KVLibError(f"all inputs must be on one device, not {sorted(map(str, devices))}")


def _check_lengths(k_cache, block_tables, lengths: torch.Tensor) -> int:
    """The longest length, after checking 1 <= seq_len <= the table's capacity and the table's
    used entries name existing blocks (a compiled kernel would read outside the pool)."""
    longest, shortest = int(lengths.max()), int(lengths.min())
    num_blocks, block_size = k_cache.shape[:2]
    capacity = block_tables.shape[1] * block_size
    if shortest < 1 or longest > capacity:
        raise KVLibError(
            f"seq_lens must lie in 1..{capacity} (max_blocks x block_size), not {shortest}..{longest}"
        )
    used = block_tables[:, : ceil_div(longest, block_size)]
    if int(used.min()) < 0 or int(used.max()) >= num_blocks:
        raise KVLibError(f"block_tables name blocks outside 0..{num_blocks - 1}")
    return longest


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    kernel: str | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its K/V stored in blocks.

    q: (batch, num_heads, head_dim) float32 (or the cache's dtype)
    k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim), float32/float16/bfloat16
    block_tables: (batch, max_blocks) int32 or int64; seq_lens: (batch,) keys per sequence (>= 1)
    kernel: None (:func:`default_kernel` of the device) or one of ``KERNELS``
    num_splits: None (:func:`choose_num_splits`) or a number of context splits (1: none)
    out: optional float32 (batch, num_heads, head_dim) the numba kernel writes into (no allocation)
    returns: (batch, num_heads, head_dim) in q's dtype; scale 1/sqrt(head_dim); float32 sums.

    The ``torch`` kernel is :func:`kvlib.kernels.torch_gather.paged_attention` (gather, then
    attend), computing in the cache's dtype with a float32 softmax, as it does for prefills.
    """
    kernel = default_kernel(q.device) if kernel is None else kernel
    _check(q, k_cache, v_cache, block_tables, seq_lens, kernel)
    longest = _check_lengths(k_cache, block_tables, seq_lens) if q.device.type == "cpu" else None
    if kernel == "torch":
        result = paged_attention(q[:, :, None].to(k_cache.dtype), k_cache, v_cache, block_tables, seq_lens)[
            :, :, 0
        ]
        return result.to(q.dtype)
    longest = int(seq_lens.max()) if longest is None else longest
    if num_splits is None:
        items = work_items(kernel, q.shape[0], k_cache.shape[2])
        num_splits = choose_num_splits(items, longest, num_workers(q.device))
    if not isinstance(num_splits, int) or num_splits < 1:
        raise KVLibError(f"num_splits must be a positive integer or None, not {num_splits!r}")
    if kernel == "numba":
        return _run_numba(q, k_cache, v_cache, block_tables, seq_lens, num_splits, out)
    from kvlib.kernels.triton_decode import triton_decode, triton_runs_on

    if not triton_runs_on(q.device):
        raise KVLibError(
            f"the triton kernel needs Triton and a CUDA device (or TRITON_INTERPRET=1 for CPU tensors), "
            f"not {q.device}"
        )

    return triton_decode(q, k_cache, v_cache, block_tables, seq_lens, num_splits, longest).to(q.dtype)


def _run_numba(q, k_cache, v_cache, block_tables, seq_lens, num_splits, out) -> torch.Tensor:
    """The numba kernel, after the checks only it needs (CPU, contiguous caches, numba present)."""
    module = numba_module()
    if module is None:
        raise KVLibError("the numba kernel needs numba, which cannot be imported here; use kernel='torch'")
    if q.device.type != "cpu":
        raise KVLibError(f"the numba kernel runs on the CPU, not {q.device}; use kernel='triton' or 'torch'")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise KVLibError("the numba kernel reads the caches in place: they must be contiguous")
    if out is not None and (out.shape != q.shape or out.dtype != torch.float32 or not out.is_contiguous()):
        raise KVLibError(f"out must be a contiguous float32 tensor of q's shape {tuple(q.shape)}")
    result = module.numba_decode(q, k_cache, v_cache, block_tables, seq_lens, num_splits, out)
    return result if q.dtype == torch.float32 else result.to(q.dtype)


def contiguous_tables(batch: int, seq_len: int, block_size: int | None = None, device=None) -> torch.Tensor:
    """The identity block table of ``batch`` sequences of ``seq_len`` tokens stored one after
    another: sequence i owns blocks i * n ... i * n + n - 1 (n blocks of ``block_size``; default one
    block of ``seq_len`` tokens per sequence). (batch, n) int64."""
    per_seq = ceil_div(seq_len, seq_len if block_size is None else block_size)
    return torch.arange(batch * per_seq, device=device).view(batch, per_seq)


def as_blocks(kv: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
    """Contiguous K or V, (batch, seq_len, num_kv_heads, head_dim), seen as a pool of blocks
    (batch * seq_len / block_size, block_size, num_kv_heads, head_dim) without a copy; read with
    :func:`contiguous_tables`. ``block_size`` must divide seq_len (default: seq_len)."""
    batch, seq_len, num_kv_heads, head_dim = kv.shape
    block_size = seq_len if block_size is None else block_size
    if seq_len % block_size:
        raise KVLibError(f"block size {block_size} does not divide the sequence length {seq_len}")
    if not kv.is_contiguous():
        raise KVLibError("as_blocks needs contiguous K/V (a view, not a copy)")
    return kv.view(batch * seq_len // block_size, block_size, num_kv_heads, head_dim)


def kernel_info(device: torch.device | str | None = None) -> dict:
    """Which kernel :func:`decode_attention` runs on ``device``, the numba and Triton versions
    (None: not importable), numba's threads and the JIT seconds of each kernel compiled so far."""
    module = numba_module()
    triton_spec = importlib.util.find_spec("triton")
    info = {
        "kernel": default_kernel(device),
        "numba": None,
        "numba_threads": None,
        "jit_seconds": {},
        "triton": None,
    }
    if module is not None:
        import numba

        from kvlib.kernels.numba_setup import jit_seconds, numba_threads

        info.update(numba=numba.__version__, numba_threads=numba_threads(), jit_seconds=jit_seconds())
    if triton_spec is not None:
        import triton

        info["triton"] = triton.__version__
    return info
