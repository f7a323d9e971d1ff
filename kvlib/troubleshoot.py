"""Running out of KV-cache memory, reproduced small and planned large (the troubleshooting page).

A server that adds sequences to a batch adds caches, and the caches grow linearly with the
batch and the context until the memory set aside for them is gone. This module shows both
ends of that story:

- :func:`batch_sweep` runs the model of chapter 1 on a paged cache (chapter 3) whose pool is
  sized from a byte budget, for growing batches. When the prompts need more blocks than the
  pool has, the block manager refuses the allocation and the run stops with a one-line
  :class:`~kvlib.KVLibError`: running out is a normal condition to report, not a crash.
- :func:`requests_that_fit` answers the planning question for a real model: how many
  requests of given lengths can hold their caches at once in the free memory of a GPU,
  when each reserves its maximum length (contiguous) or only the blocks it fills (paged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kvlib import KVLibError
from kvlib.cache import kv_bytes_per_token
from kvlib.model import TinyLlama
from kvlib.paged_attention import generate_paged


@dataclass(frozen=True)
class BatchOutcome:
    """One run of :func:`batch_sweep`: did ``batch`` requests fit in the pool, and if not, why."""

    batch: int
    num_blocks: int  # blocks the byte budget buys
    pool_bytes: int | None  # bytes of the K/V pool of a finished run (None if the run was refused)
    error: str | None  # the refusal, or None when every request finished

    @property
    def ran(self) -> bool:
        return self.error is None

    def row(self) -> dict:
        outcome = f"ran in a pool of {self.pool_bytes:,} bytes" if self.ran else f"refused: {self.error}"
        return {"batch": self.batch, "blocks in budget": self.num_blocks, "outcome": outcome}


def block_bytes(model: TinyLlama, block_size: int) -> int:
    """Bytes of one block of the paged cache: ``block_size`` tokens' K and V in every layer."""
    return block_size * kv_bytes_per_token(model.config, model.lm_head.weight.dtype)


def batch_sweep(model: TinyLlama, prompts: Sequence[Sequence[int]], num_new: int, budget_bytes: int,
                batches: Sequence[int], block_size: int = 16) -> list[BatchOutcome]:
    """Generate ``num_new`` tokens for the first ``batch`` prompts, for each batch, in a pool of
    ``budget_bytes // block_bytes`` blocks; a refusal by the block manager is recorded, not raised."""
    num_blocks = budget_bytes // block_bytes(model, block_size)
    if num_blocks < 1:
        raise KVLibError(f"a budget of {budget_bytes:,} bytes holds no block of {block_bytes(model, block_size):,} bytes")
    if not batches or min(batches) < 1 or max(batches) > len(prompts):
        raise KVLibError(f"batches must lie between 1 and the {len(prompts)} prompts given, not {list(batches)}")
    outcomes = []
    for batch in batches:
        try:
            run = generate_paged(model, prompts[:batch], num_new, block_size=block_size, num_blocks=num_blocks)
            outcomes.append(BatchOutcome(batch, num_blocks, run.cache.num_bytes, None))
        except KVLibError as error:
            outcomes.append(BatchOutcome(batch, num_blocks, None, str(error)))
    return outcomes


def requests_that_fit(lengths: Sequence[int], free_bytes: int, bytes_per_token: int,
                      block_size: int | None = 16, reserve: int | None = None) -> int:
    """How many of the requests, taken in order, hold their caches at once in ``free_bytes``.

    Each request of final length ``n`` takes ``reserve`` token slots if given (contiguous
    reservation of the maximum length), else ``n`` rounded up to whole blocks of
    ``block_size`` (paging; ``None`` means exactly ``n``).
    """
    if free_bytes < 0 or bytes_per_token < 1:
        raise KVLibError(f"need free_bytes >= 0 and bytes_per_token >= 1, not {free_bytes} and {bytes_per_token}")
    if reserve is not None and max(lengths, default=0) > reserve:
        raise KVLibError(f"a request of {max(lengths)} tokens does not fit its reservation of {reserve}")
    used, fitted = 0, 0
    for n in lengths:
        if n < 1:
            raise KVLibError(f"request lengths must be positive, not {n}")
        slots = reserve if reserve is not None else (n if block_size is None else -(-n // block_size) * block_size)
        used += slots * bytes_per_token
        if used > free_bytes:
            break
        fitted += 1
    return fitted
