"""Contiguous allocators for the reservation policies of chapter 4: buddy and first fit.

The reservation policies of :mod:`kvlib.serving.placement` (``max``, ``pow2``,
``oracle``) give each request one contiguous range of token slots. The vLLM paper assumes
its Orca baselines place them with the buddy allocation algorithm (Kwon et al. 2023,
Section 6.1): :class:`BuddyAllocator` does that, so every reservation occupies a block of
a power-of-two size. :class:`ContiguousAllocator` (first fit, no rounding) shows what the
allocator itself costs. Both answer in the same words: ``allocate`` a range (its start,
or ``None``), ``free`` it, its ``footprint`` and the ``largest_gap`` left.
"""

from __future__ import annotations

import bisect


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n itself if it is one)."""
    return 1 << (n - 1).bit_length()


class ContiguousAllocator:
    """First-fit placement of contiguous ranges in a line of ``num_slots`` slots.

    Free memory is a sorted list of gaps (start, size); freeing merges a range with the
    gaps beside it. A request fits only if one gap is large enough.
    """

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.gaps: list[tuple[int, int]] = [(0, num_slots)]  # (start, size) of each free range, sorted

    @staticmethod
    def footprint(size: int) -> int:
        """Slots a range of ``size`` occupies: exactly ``size``."""
        return size

    @property
    def num_free(self) -> int:
        """Free slots, over all gaps."""
        return sum(size for _, size in self.gaps)

    @property
    def largest_gap(self) -> int:
        """The largest range that ``allocate`` can place now."""
        return max((size for _, size in self.gaps), default=0)

    def allocate(self, size: int) -> int | None:
        """Start of a range of ``size`` slots in the first gap that holds it, or ``None``."""
        for i, (start, gap) in enumerate(self.gaps):
            if gap >= size:
                self.gaps[i : i + 1] = [(start + size, gap - size)] if gap > size else []
                return start
        return None

    def free(self, start: int, size: int) -> None:
        """Give back the range of ``size`` slots at ``start``, merged with the free gaps beside it."""
        i = bisect.bisect(self.gaps, (start, size))
        if i > 0 and self.gaps[i - 1][0] + self.gaps[i - 1][1] == start:  # merge with the gap before
            i -= 1
            start, size = self.gaps[i][0], self.gaps[i][1] + size
            del self.gaps[i]
        if i < len(self.gaps) and start + size == self.gaps[i][0]:  # and with the gap after
            size += self.gaps.pop(i)[1]
        self.gaps.insert(i, (start, size))


class BuddyAllocator:
    """Buddy allocation of contiguous ranges in a line of ``num_slots`` slots (Knuth's buddy system).

    A range occupies a block of 2^k slots that starts at a multiple of 2^k, the smallest
    such block that holds it: a request of 520 slots takes 1,024. A free block is split in
    halves ("buddies") until it fits; when a block is freed and its buddy is free too, the
    two merge back. A budget that is not a power of two is cut into the powers of two of
    its binary digits, largest first (15,792 = 8,192 + 4,096 + 2,048 + 1,024 + 256 + 128 +
    32 + 16), which never merge with each other. Among free blocks large enough, the
    smallest is split, at the lowest address.
    """

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.free_blocks: dict[int, set[int]] = {}  # order k -> starts of free blocks of 2^k slots
        self.region_orders: dict[int, int] = {}  # start of each top-level block -> its order
        start = 0
        for order in reversed(range(num_slots.bit_length())):
            if num_slots >> order & 1:
                self.region_orders[start] = order
                self.free_blocks.setdefault(order, set()).add(start)
                start += 1 << order
        self.region_starts = sorted(self.region_orders)

    @staticmethod
    def footprint(size: int) -> int:
        """Slots a range of ``size`` occupies: the next power of two."""
        return next_pow2(size)

    @property
    def num_free(self) -> int:
        """Free slots, over all free blocks."""
        return sum(len(starts) << order for order, starts in self.free_blocks.items())

    @property
    def largest_gap(self) -> int:
        """The largest free block: the largest footprint ``allocate`` can place now."""
        return max((1 << order for order, starts in self.free_blocks.items() if starts), default=0)

    def allocate(self, size: int) -> int | None:
        """Start of a block of ``footprint(size)`` slots, or ``None`` if no free block is that large."""
        order = (size - 1).bit_length()
        fitting = [k for k, starts in self.free_blocks.items() if k >= order and starts]
        if not fitting:
            return None
        k = min(fitting)
        start = min(self.free_blocks[k])
        self.free_blocks[k].remove(start)
        while k > order:  # split: keep the lower half, free the upper one
            k -= 1
            self.free_blocks.setdefault(k, set()).add(start + (1 << k))
        return start

    def free(self, start: int, size: int) -> None:
        """Give back the block of a range of ``size`` slots at ``start``, merged with its free buddies."""
        order = (size - 1).bit_length()
        region = self.region_starts[bisect.bisect(self.region_starts, start) - 1]
        while order < self.region_orders[region]:
            buddy = start ^ (1 << order)  # blocks are aligned to their size, so the buddy differs in one bit
            if buddy not in self.free_blocks.get(order, ()):
                break
            self.free_blocks[order].remove(buddy)
            start, order = min(start, buddy), order + 1
        self.free_blocks.setdefault(order, set()).add(start)
