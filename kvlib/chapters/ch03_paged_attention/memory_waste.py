"""Memory that contiguous reservation wastes, against paging: :func:`reservation_waste` (chapter 3).

Reserving each request's maximum length contiguously leaves every slot past its true length
empty; paging (:class:`kvlib.paged.block_manager.BlockManager`) wastes only the unfilled
tail of each request's last block. :func:`kvlib.plotting.draw_memory_waste` draws the
comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.paged.block_manager import BlockManager, num_blocks_for
from kvlib.paged.usage import block_usage


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
        """Requests placed."""
        return len(self.lengths)

    @property
    def used_slots(self) -> int:
        """Slots that hold a token: the requests' lengths summed."""
        return sum(self.lengths)

    @property
    def contiguous_slots(self) -> int:
        """Slots reserved contiguously: ``max_len`` per request."""
        return self.num_requests * self.max_len

    @property
    def internal_fragmentation(self) -> int:
        """Empty slots of the blocks the requests took."""
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
        sum(num_blocks_for(n, block_size) for n in lengths), block_size, enable_prefix_caching=False
    )
    for seq_id, n in enumerate(lengths):
        manager.allocate(seq_id, [0] * n)
    usage = block_usage(manager)
    return ReservationWaste(lengths, max_len, block_size, usage.num_used_blocks * block_size)
