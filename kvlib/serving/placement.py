"""Where each request's KV cache goes under a fixed budget of token slots (chapter 4).

Four placement policies share one budget:

- ``max``: reserve, contiguously, the model's maximum length (2,048) for every request;
- ``pow2``: reserve the next power of two of the request's true total length;
- ``oracle``: reserve exactly the true total length (nobody knows it in practice);
- ``paged``: blocks of 16 slots from a :class:`~kvlib.paged.BlockManager`, one more block
  only when the last is full.

These are the vLLM paper's Orca-Max, Orca-Pow2, Orca-Oracle and vLLM. The paper built its
own Orca and assumed that it places each reservation with the buddy allocation algorithm
(Kwon et al. 2023, Section 6.1); :class:`BuddyAllocator` does that, so every reservation
occupies a block of a power-of-two size. :class:`ContiguousAllocator` (first fit, no
rounding) is kept to show what the allocator itself costs. Every memory answers the
scheduler of :mod:`kvlib.serving` in the same words: ``admit`` a request, ``append`` a slot
for its newest token (``paged`` may say no), ``release`` it, and ``breakdown``: where every
slot of the budget is.
"""

from __future__ import annotations

from kvlib import KVLibError
from kvlib.checks import require_int, require_real
from kvlib.paged.block_manager import Allocation, BlockManager, num_blocks_for
from kvlib.paged.usage import stored_tokens
from kvlib.serving.allocators import BuddyAllocator, ContiguousAllocator, next_pow2
from kvlib.serving.traces import Request
from kvlib.serving.types import SeqState, StepPlan

POLICIES = ("max", "pow2", "oracle", "paged")

ALLOCATORS = ("buddy", "first-fit")  # how a reservation policy places its contiguous ranges


def reservation_slots(policy: str, request: Request, max_len: int) -> int:
    """Slots a reserving policy asks for when a request starts (before any allocator rounding).

    As the vLLM paper defines its baselines (Section 6.1): ``max`` reserves the model's
    maximum length, ``pow2`` the prompt plus the output length rounded up to a power of two
    (at most twice the output: 25 output tokens get 32 slots), ``oracle`` the true length.
    """
    if policy == "max":
        return max_len
    if policy == "pow2":
        return min(max_len, request.prompt_len + next_pow2(request.output_len))
    if policy == "oracle":
        return request.total_len
    raise KVLibError(f"unknown reservation policy {policy!r}; choose from max, pow2, oracle")


class ReservedMemory:
    """``max``, ``pow2`` or ``oracle``: one contiguous reservation per request, held until it finishes.

    ``allocator``: ``"buddy"`` (the paper's assumption, the default) or ``"first-fit"``.
    ``manager`` (optional) mirrors the tokens into a block manager: the real engine stores
    K/V in paged blocks whatever the policy, and only admits by the reservation.
    """

    def __init__(
        self,
        policy: str,
        num_slots: int,
        max_len: int,
        manager: BlockManager | None = None,
        allocator: str = "buddy",
    ):
        num_slots, max_len = require_int(num_slots, "num_slots"), require_int(max_len, "max_len")
        reservation_slots(policy, Request(0, 0.0, (0,), 1), max_len)  # validates the name
        if allocator not in ALLOCATORS:
            raise KVLibError(f"unknown allocator {allocator!r}; choose from {', '.join(ALLOCATORS)}")
        if max_len > num_slots:
            raise KVLibError(
                f"a budget of {num_slots} slots cannot hold one request of max_len {max_len} tokens: "
                f"num_slots must be >= max_len (or lower max_len)"
            )
        self.policy, self.max_len, self.manager = policy, max_len, manager
        self.allocator = BuddyAllocator(num_slots) if allocator == "buddy" else ContiguousAllocator(num_slots)
        if self.allocator.largest_gap < self.allocator.footprint(max_len):
            raise KVLibError(
                f"no block of a budget of {num_slots} slots holds one request of max_len {max_len} tokens"
            )
        self.placed: dict[int, tuple[int, int]] = {}  # seq_id -> (start, size)
        self.num_slots = num_slots
        self.num_reserved = 0  # slots reserved, over running requests
        self.num_needed = 0  # of which a request will fill: min(reservation, true total length)

    def need(self, seq: SeqState) -> int:
        """Slots the policy asks for (the allocator may round them up: see ``allocator.footprint``)."""
        return reservation_slots(self.policy, seq.request, self.max_len)

    def admit(self, seq: SeqState) -> int | None:
        """Place the request's reservation; returns the tokens already cached (0), or ``None`` if no gap fits.

        A mirroring manager keeps a reference to ``seq.tokens``, the request's one token list.
        """
        start = self.allocator.allocate(self.need(seq))
        if start is None:
            return None
        size = self.allocator.footprint(self.need(seq))
        self.placed[seq.seq_id] = (start, size)
        self.num_reserved += size
        self.num_needed += min(size, seq.request.total_len)
        if self.manager is not None and self.manager.allocate(seq.seq_id, seq.tokens) is None:
            raise KVLibError("the storage behind a reservation policy ran out of blocks")
        return 0

    def append(self, seq: SeqState) -> bool:
        """A slot for the request's newest token: always inside its reservation (mirrored in the manager)."""
        if self.manager is not None and self.manager.append_slot(seq.seq_id) is None:
            raise KVLibError("the storage behind a reservation policy ran out of blocks")
        return True  # the reservation already holds the slot

    def mark_computed(self, plan: StepPlan) -> None:
        """The step's K/V exist now: the mirroring manager, if any, records it."""
        if self.manager is not None:
            mark_plan_computed(self.manager, plan)

    def release(self, seq: SeqState) -> None:
        """Free the request's reservation (and its mirrored blocks)."""
        start, size = self.placed.pop(seq.seq_id)
        self.allocator.free(start, size)
        self.num_reserved -= size
        self.num_needed -= min(size, seq.request.total_len)
        if self.manager is not None:
            self.manager.free(seq.seq_id)

    def breakdown(self, held: int, head: SeqState | None) -> tuple[int, ...]:
        """Slots per category of :data:`CATEGORIES`; ``held`` = slots holding tokens.

        ``reserved``: slots for tokens the requests will still produce; ``internal``: slots
        reserved beyond a request's true total length (by the policy, or by the allocator's
        rounding); ``external``: free slots while the first waiting request could be placed
        if they were one range but no gap holds it.
        """
        free = self.num_slots - self.num_reserved
        footprint = self.allocator.footprint(self.need(head)) if head is not None else 0
        blocked = head is not None and self.allocator.largest_gap < footprint <= free
        external = free if blocked else 0
        return held, self.num_needed - held, self.num_reserved - self.num_needed, external, free - external


class BlockCounter:
    """The block arithmetic of a :class:`BlockManager` for sequences that share nothing: counts, no tables.

    It takes and frees exactly the blocks a manager without prefix caching would
    (``tests/serving/test_scheduler.py`` checks it step by step) at a fraction of the cost: a simulated
    run appends hundreds of thousands of tokens. The real engine uses the real manager.
    """

    def __init__(self, num_blocks: int, block_size: int):
        num_blocks, block_size = (
            require_int(num_blocks, "num_blocks"),
            require_int(block_size, "block_size"),
        )
        self.num_blocks, self.block_size, self.num_free_blocks = num_blocks, block_size, num_blocks
        self.num_slots: dict[int, int] = {}  # seq_id -> tokens with a slot

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks of this counter's ``block_size`` needed to hold ``num_tokens`` tokens."""
        return num_blocks_for(num_tokens, self.block_size)

    def num_blocks_short(self, token_ids) -> int:
        """Free blocks that ``allocate(token_ids)`` would lack (negative: how many would stay free)."""
        return self.num_blocks_for(len(token_ids)) - self.num_free_blocks

    def can_allocate(self, token_ids) -> bool:
        """Are there enough free blocks for this prompt?"""
        return self.num_blocks_short(token_ids) <= 0

    def allocate(self, seq_id: int, token_ids) -> Allocation | None:
        """Count the blocks of a new sequence's prompt (only its length); ``None`` if they do not fit."""
        if seq_id in self.num_slots:
            raise KVLibError(f"sequence {seq_id} already has blocks")
        if not self.can_allocate(token_ids):
            return None
        self.num_free_blocks -= self.num_blocks_for(len(token_ids))
        self.num_slots[seq_id] = len(token_ids)
        return Allocation(seq_id, 0, self.num_blocks_for(len(token_ids)))

    def append_slot(self, seq_id: int) -> int | None:
        """One more token of the sequence gets a slot: returns its position (a manager returns the slot),
        or ``None`` when a block is needed and none is free."""
        n = self.num_slots[seq_id]
        if n % self.block_size == 0:
            if self.num_free_blocks == 0:
                return None
            self.num_free_blocks -= 1
        self.num_slots[seq_id] = n + 1
        return n

    def free(self, seq_id: int) -> None:
        """Give back the sequence's blocks."""
        self.num_free_blocks += self.num_blocks_for(self.num_slots.pop(seq_id))

    def mark_computed(self, seq_id: int, num_tokens: int | None = None) -> None:
        """Nothing to do: no prefix cache."""


class PagedMemory:
    """``paged``: a :class:`BlockManager` gives each request blocks as its tokens arrive.

    Admission keeps ``watermark`` blocks free (vLLM keeps 1%), so that running requests
    can grow for a while before someone must be preempted. There is no external
    fragmentation: any free block serves any request.
    """

    policy = "paged"

    def __init__(self, manager: BlockManager | BlockCounter, max_len: int, watermark: float = 0.01):
        if not 0 <= require_real(watermark, "the watermark") < 1:
            raise KVLibError(f"the watermark is a share of the blocks in [0, 1), not {watermark}")
        self.manager, self.max_len = manager, max_len
        self.watermark_blocks = int(watermark * manager.num_blocks)
        if manager.num_blocks_for(max_len) + self.watermark_blocks > manager.num_blocks:
            raise KVLibError(
                f"{manager.num_blocks} blocks of {manager.block_size} "
                f"cannot hold one request of {max_len} tokens"
            )
        self.num_slots = manager.num_blocks * manager.block_size

    def admit(self, seq: SeqState) -> int | None:
        """Blocks for the request's tokens; returns how many were already cached, or ``None``.

        The manager keeps a reference to ``seq.tokens``, the request's one token list.
        """
        if -self.manager.num_blocks_short(seq.tokens) < self.watermark_blocks:
            return None  # it would not fit, or leave fewer than watermark blocks free
        return self.manager.allocate(seq.seq_id, seq.tokens).num_cached_tokens

    def append(self, seq: SeqState) -> bool:
        """A slot for the request's newest token (already in ``seq.tokens``); False if no block is free."""
        return self.manager.append_slot(seq.seq_id) is not None

    def release(self, seq: SeqState) -> None:
        """Free the request's blocks."""
        self.manager.free(seq.seq_id)

    def mark_computed(self, plan: StepPlan) -> None:
        """The step's K/V exist now (the simulator says so; the real cache marks them itself)."""
        if isinstance(self.manager, BlockCounter):
            return  # it keeps no prefix cache to update
        mark_plan_computed(self.manager, plan)

    def breakdown(self, held: int, head: SeqState | None) -> tuple[int, ...]:
        """Slots holding tokens, empty slots of used blocks (``internal``), and free slots.

        Without sharing every held token has its own slot. With prefix caching a shared
        block is stored once, so the manager counts stored tokens itself (slower: it walks
        every block table).
        """
        manager = self.manager
        used = (manager.num_blocks - manager.num_free_blocks) * manager.block_size
        if getattr(manager, "enable_prefix_caching", False):
            held = stored_tokens(manager)
        return held, 0, used - held, 0, self.num_slots - used


def mark_plan_computed(manager: BlockManager, plan: StepPlan) -> None:
    """Tell a block manager which K/V a step wrote: each prefill's up to its chunk's end (all of its
    tokens without chunked prefill), each decode's all."""
    if plan.prefill_ends is None:
        for seq in plan.seqs:
            manager.mark_computed(seq.seq_id)
        return
    for seq, _, end in plan.chunks:
        manager.mark_computed(seq.seq_id, end)
    for seq in plan.decodes:
        manager.mark_computed(seq.seq_id)


def make_memory(
    policy: str,
    num_slots: int,
    max_len: int,
    block_size: int = 16,
    manager: BlockManager | None = None,
    enable_prefix_caching: bool = False,
    allocator: str = "buddy",
    watermark: float = 0.01,
):
    """The memory of one policy over a budget of ``num_slots`` token slots.

    ``allocator`` concerns the reservation policies, ``watermark`` (the share of blocks
    admission keeps free) the paged one. Every count is checked to be an integer >= 1 first: a
    ``block_size`` of 0 divided by zero, and one of 1.5 ran on with fractional blocks.
    """
    num_slots, max_len = require_int(num_slots, "num_slots"), require_int(max_len, "max_len")
    block_size = require_int(block_size, "block_size")
    if not isinstance(enable_prefix_caching, bool):
        raise KVLibError(f"enable_prefix_caching must be True or False, not {enable_prefix_caching!r}")
    if not isinstance(allocator, str) or allocator not in ALLOCATORS:
        raise KVLibError(f"unknown allocator {allocator!r}; choose from {', '.join(ALLOCATORS)}")
    if policy == "paged":
        if num_slots < block_size:
            raise KVLibError(f"a budget of {num_slots} slots holds no block of {block_size}")
        if manager is None and enable_prefix_caching:
            manager = BlockManager(num_slots // block_size, block_size, enable_prefix_caching=True)
        return PagedMemory(manager or BlockCounter(num_slots // block_size, block_size), max_len, watermark)
    if policy not in POLICIES:
        raise KVLibError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    return ReservedMemory(policy, num_slots, max_len, manager, allocator)
