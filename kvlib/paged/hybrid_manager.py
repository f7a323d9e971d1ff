"""Block tables per layer group over one pool: full attention, sliding windows, fixed states (chapter 10).

A model whose layers differ in what they keep (Gemma-2 and Gemma-3: sliding-window layers beside
global ones; Jamba: a few attention layers among Mamba layers) wastes memory in a block manager
that treats every layer alike. vLLM v1's hybrid KV cache manager splits the layers into *groups*
of one kind and equal size, gives each group its own block table per sequence, and takes every
block from one shared pool. What a group does with its blocks depends on its kind:

- full attention keeps every block (vLLM's ``FullAttentionManager``);
- a sliding window of ``window`` tokens lets the query at position ``p`` see keys ``p - window + 1``
  to ``p``; once ``n`` tokens are computed no later query sees a key before ``n - window + 1``, so
  the blocks wholly before it go back to the pool and the table points at the *null block* instead
  (vLLM's ``SlidingWindowManager.remove_skipped_blocks``);
- a fixed-state group (Mamba layers) holds ``state_blocks`` blocks per sequence whatever its length
  (vLLM's ``MambaManager``, which sizes the page so that one state fits one block).

:class:`HybridBlockManager` does this by composition on :class:`~kvlib.paged.block_pool.BlockPool`
(block 0 is the null block, taken once and never freed). It is plain Python bookkeeping, with no
prefix caching and no copy-on-write (those are chapter 3's :class:`~kvlib.paged.BlockManager`).
With ``free_out_of_window=False`` a sliding group keeps every block, as an allocator that knows only
full attention would. :mod:`kvlib.paged.window_cache` stores K/V through it for a real model;
chapter 10 measures the capacity it buys on published layer shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.checks import check_seq_id, require_int
from kvlib.paged.block_manager import computed_count, num_blocks_for
from kvlib.paged.block_pool import BlockPool

NULL_BLOCK = 0  # the block id a sliding group's table holds where a block was freed


@dataclass(frozen=True)
class KVGroupSpec:
    """One layer group: its name, its layers, and what it keeps per sequence."""

    name: str
    num_layers: int  # layers whose K/V (or state) one block of this group holds
    window: int | None = None  # sliding window in tokens; None: full attention (or a state group)
    state_blocks: int = 0  # > 0: a fixed-state (Mamba) group holding this many blocks per sequence

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise KVLibError(f"a group's name must be a string, not {self.name!r}"[:200])
        require_int(self.num_layers, f"group {self.name!r}: num_layers")
        if self.window is not None:
            require_int(self.window, f"group {self.name!r}: window")
        require_int(self.state_blocks, f"group {self.name!r}: state_blocks", low=0)
        if self.state_blocks and self.window is not None:
            raise KVLibError(f"group {self.name!r}: a fixed-state group has no window")

    @property
    def kind(self) -> str:
        """ "full", "sliding" or "state"."""
        if self.state_blocks:
            return "state"
        return "full" if self.window is None else "sliding"


@dataclass
class HybridSequence:
    """What the manager knows about one sequence: its tokens and one block list per group."""

    seq_id: int
    num_tokens: int  # tokens with a slot
    num_computed: int  # tokens whose K/V are written
    tables: list[list[int]]  # per group: the block table (a state group: its state blocks)


class HybridBlockManager:
    """Per-sequence block tables of several layer groups over one :class:`BlockPool` of ``num_blocks``."""

    def __init__(
        self,
        groups: Sequence[KVGroupSpec],
        num_blocks: int,
        block_size: int,
        free_out_of_window: bool = True,
    ):
        if not groups or not all(isinstance(g, KVGroupSpec) for g in groups):
            raise KVLibError(f"groups must be a non-empty list of KVGroupSpec, not {groups!r}"[:200])
        if len({g.name for g in groups}) != len(groups):
            raise KVLibError(f"group names must differ: {[g.name for g in groups]}")
        if not isinstance(free_out_of_window, bool):
            raise KVLibError(f"free_out_of_window must be True or False, not {free_out_of_window!r}")
        self.groups = tuple(groups)
        self.block_size = require_int(block_size, "block_size")
        self.pool = BlockPool(require_int(num_blocks, "num_blocks") + 1)  # + the null block
        self.null_block = self.pool.get_new_blocks(1)[0]  # block 0, held for good
        self.free_out_of_window = free_out_of_window
        self.sequences: dict[int, HybridSequence] = {}
        self.num_window_frees = 0  # blocks a window has given back so far

    # ------------------------------------------------------------------ queries

    @property
    def num_blocks(self) -> int:
        """Usable blocks in the pool (the null block not counted)."""
        return len(self.pool.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds."""
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks some sequence holds."""
        return self.num_blocks - self.num_free_blocks

    def group_index(self, group: int | str) -> int:
        """The index of a group given by index or by name."""
        if isinstance(group, str):
            for i, spec in enumerate(self.groups):
                if spec.name == group:
                    return i
            raise KVLibError(f"unknown group {group!r}; the groups are {[g.name for g in self.groups]}")
        return require_int(group, "group", 0, len(self.groups) - 1)

    def block_table(self, seq_id: int, group: int | str) -> list[int]:
        """A copy of one group's block table of a sequence (``NULL_BLOCK`` where a window freed one)."""
        return list(self._get(seq_id).tables[self.group_index(group)])

    def num_held_blocks(self, seq_id: int, group: int | str | None = None) -> int:
        """Blocks a sequence holds, in one group or (``None``) in all."""
        tables = self._get(seq_id).tables
        chosen = range(len(tables)) if group is None else [self.group_index(group)]
        return sum(sum(1 for b in tables[i] if b != NULL_BLOCK) for i in chosen)

    def num_tokens(self, seq_id: int) -> int:
        """Tokens of the sequence that have a slot."""
        return self._get(seq_id).num_tokens

    def num_computed(self, seq_id: int) -> int:
        """Tokens of the sequence whose K/V are written."""
        return self._get(seq_id).num_computed

    def slot(self, seq_id: int, group: int | str, position: int) -> int:
        """The pool slot of token ``position`` in an attention group (its block must be held)."""
        seq, index = self._get(seq_id), self.group_index(group)
        if self.groups[index].kind == "state":
            raise KVLibError(f"group {self.groups[index].name!r} keeps a state, not token slots")
        position = require_int(position, "a token position", low=None)
        if not 0 <= position < seq.num_tokens:
            raise KVLibError(f"position {position} is outside sequence {seq_id} of {seq.num_tokens} tokens")
        block = seq.tables[index][position // self.block_size]
        if block == NULL_BLOCK:
            raise KVLibError(f"position {position} of sequence {seq_id} fell out of group {index}'s window")
        return block * self.block_size + position % self.block_size

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.sequences

    # ------------------------------------------------------------------ allocate / append / free

    def _num_new_blocks(self, tables: list[list[int]], num_tokens: int) -> int:
        """Blocks the groups must take from the pool to hold ``num_tokens`` tokens."""
        needed = 0
        for spec, table in zip(self.groups, tables, strict=True):
            want = spec.state_blocks if spec.kind == "state" else num_blocks_for(num_tokens, self.block_size)
            needed += max(0, want - len(table))
        return needed

    def can_allocate(self, num_tokens: int) -> bool:
        """Are there enough free blocks for a new sequence of ``num_tokens`` tokens in every group?"""
        num_tokens = require_int(num_tokens, "num_tokens")
        return self._num_new_blocks([[] for _ in self.groups], num_tokens) <= self.num_free_blocks

    def allocate(self, seq_id: int, num_tokens: int) -> bool:
        """Give a new sequence blocks for its first ``num_tokens`` tokens in every group (and its
        states); False, changing nothing, if the pool is short."""
        check_seq_id(seq_id)
        if seq_id in self.sequences:
            raise KVLibError(f"sequence {seq_id} already has blocks (free it first or pick a new id)")
        if not self.can_allocate(num_tokens):
            return False
        seq = HybridSequence(seq_id, 0, 0, [[] for _ in self.groups])
        self.sequences[seq_id] = seq
        self._grow(seq, num_tokens)
        return True

    def append_slots(self, seq_id: int, num_new: int = 1) -> bool:
        """Give the next ``num_new`` tokens of a sequence slots in every attention group; False,
        changing nothing, if the pool is short. Blocks a window already let go are not taken again."""
        seq = self._get(seq_id)
        num_new = require_int(num_new, "num_new")
        if self._num_new_blocks(seq.tables, seq.num_tokens + num_new) > self.num_free_blocks:
            return False
        self._grow(seq, seq.num_tokens + num_new)
        return True

    def _grow(self, seq: HybridSequence, num_tokens: int) -> None:
        for spec, table in zip(self.groups, seq.tables, strict=True):
            want = spec.state_blocks if spec.kind == "state" else num_blocks_for(num_tokens, self.block_size)
            table += [b.block_id for b in self.pool.get_new_blocks(max(0, want - len(table)))]
        seq.num_tokens = num_tokens

    def mark_computed(self, seq_id: int, num_tokens: int | None = None) -> None:
        """Record that the K/V of the first ``num_tokens`` tokens (default: all with a slot) are
        written, then give back every sliding group's blocks that no later query can see."""
        seq = self._get(seq_id)
        seq.num_computed = num_tokens = computed_count(seq, seq_id, num_tokens)
        if self.free_out_of_window:
            for spec, table in zip(self.groups, seq.tables, strict=True):
                if spec.kind == "sliding":
                    self._free_skipped(table, _first_needed(num_tokens, spec.window, self.block_size))

    def _free_skipped(self, table: list[int], first_needed: int) -> None:
        """Free the blocks before ``first_needed``, newest first, and put the null block in their place."""
        freed = []
        for i in range(first_needed - 1, -1, -1):
            if table[i] == NULL_BLOCK:  # the ones before were freed by an earlier call
                break
            freed.append(self.pool.blocks[table[i]])
            table[i] = NULL_BLOCK
        self.pool.free_blocks(freed)
        self.num_window_frees += len(freed)

    def free(self, seq_id: int) -> None:
        """Release a finished sequence's blocks in every group (the null block stays)."""
        seq = self._get(seq_id)
        held = [self.pool.blocks[b] for table in seq.tables for b in reversed(table) if b != NULL_BLOCK]
        self.pool.free_blocks(held)
        del self.sequences[seq_id]

    def _get(self, seq_id: int) -> HybridSequence:
        check_seq_id(seq_id)
        seq = self.sequences.get(seq_id)
        if seq is None:
            raise KVLibError(f"unknown sequence {seq_id!r}")
        return seq


def first_needed_block(num_computed: int, window: int, block_size: int) -> int:
    """The first block a sliding window of ``window`` tokens still needs once ``num_computed`` tokens
    are computed: the next query (position ``num_computed``) sees keys from ``num_computed - window + 1``
    on, so the blocks wholly before that key are never read again (vLLM's ``last_useful_token``).

    Checked (a one-line KVLibError for a negative count, a window or block size below 1); the
    manager's own loop calls the unchecked :func:`_first_needed`."""
    require_int(num_computed, "num_computed", low=0)
    require_int(window, "window")
    require_int(block_size, "block_size")
    return _first_needed(num_computed, window, block_size)


def _first_needed(num_computed: int, window: int, block_size: int) -> int:
    return max(0, num_computed - window + 1) // block_size


def held_blocks_per_sequence(groups: Sequence[KVGroupSpec], num_tokens: int, block_size: int) -> int:
    """Blocks one computed sequence of ``num_tokens`` tokens holds with windows freeing: the closed
    form of what :class:`HybridBlockManager` keeps (chapter 10 checks the two agree)."""
    if not isinstance(groups, list | tuple) or not all(isinstance(g, KVGroupSpec) for g in groups):
        raise KVLibError(f"groups must be a list of KVGroupSpec, not {groups!r}"[:200])
    require_int(num_tokens, "num_tokens", low=0)
    require_int(block_size, "block_size")
    total = 0
    for spec in groups:
        if spec.kind == "state":
            total += spec.state_blocks
        else:
            total += num_blocks_for(num_tokens, block_size)
            if spec.kind == "sliding":
                total -= _first_needed(num_tokens, spec.window, block_size)
    return total
