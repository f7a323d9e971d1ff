"""Measurements of chapter 3: paged vs contiguous attention (equality and time), the memory
that contiguous reservation wastes, and ``bench()`` for ``python -m kvlib bench``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.paged.block_manager import BlockManager
from kvlib.units import ceil_div


@dataclass(frozen=True)
class ReservationWaste:
    """Token slots for a set of requests: reserved contiguously for ``max_len`` each, or in blocks.

    ``used_slots`` hold real tokens. Contiguous reservation wastes ``contiguous_slots -
    used_slots``; paging wastes only the unfilled tails of last blocks
    (``internal_fragmentation``), about half a block per request on average.
    """

    lengths: tuple[int, ...]
    max_len: int
    block_size: int
    paged_slots: int  # blocks taken by the block manager x block_size

    @property
    def num_requests(self) -> int:
        return len(self.lengths)

    @property
    def used_slots(self) -> int:
        return sum(self.lengths)

    @property
    def contiguous_slots(self) -> int:
        return self.num_requests * self.max_len

    @property
    def internal_fragmentation(self) -> int:
        return self.paged_slots - self.used_slots

    @property
    def expected_fragmentation(self) -> float:
        """(block_size - 1) / 2 slots per request: the last block's fill is uniform over 1..block_size."""
        return self.num_requests * (self.block_size - 1) / 2


def reservation_waste(lengths: Sequence[int], max_len: int, block_size: int = 16) -> ReservationWaste:
    """Place every request (its full final length) in a :class:`BlockManager` and count the slots."""
    lengths = tuple(int(n) for n in lengths)
    if not lengths or min(lengths) < 1:
        raise KVLibError(f"request lengths must be positive, not {lengths[:5]}...")
    if max(lengths) > max_len:
        raise KVLibError(f"a request of {max(lengths)} tokens exceeds max_len {max_len}")
    manager = BlockManager(
        sum(ceil_div(n, block_size) for n in lengths), block_size, enable_prefix_caching=False
    )
    for seq_id, n in enumerate(lengths):
        manager.allocate(seq_id, [0] * n)
    usage = manager.usage()
    return ReservationWaste(lengths, max_len, block_size, usage.num_used_blocks * block_size)
