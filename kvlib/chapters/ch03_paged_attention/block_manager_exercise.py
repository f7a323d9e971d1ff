"""Chapter 3's implementation exercise 3.3: a block manager with copy-on-write, graded by kvlib's.

The reader writes the class and the check runs it beside kvlib's own: ``check_3_3`` drives the
reader's class and :class:`kvlib.paged.block_manager.BlockManager` through the same seeded random
allocate / append_slot / fork / free operations (a few hundred, no hypothesis needed) and compares,
after every one, the block tables up to the names of the blocks, the reference counts, the free
blocks and the copies. Each known mistake gets its own hint (``WRONG_CLASSES``: one buggy class per
mistake); :mod:`kvlib.chapters.ch03_paged_attention.exercises` imports the check, so ``check("3.3",
MyBlockManager)`` finds it.
"""

from __future__ import annotations

import random
import traceback

from kvlib.paged.block_manager import BlockManager
from kvlib.units import ceil_div


class SmallBlockManager:
    """Exercise 3.3's reference: block tables, reference counts and copy-on-write in a few lines."""

    def __init__(self, num_blocks, block_size, copy_block):
        self.block_size, self.copy_block = block_size, copy_block  # copy_block(src, dst) copies K/V
        self.free_list = list(range(num_blocks))  # blocks no table points at
        self.ref = [0] * num_blocks  # ref_cnt of every block
        self.tables, self.lengths = {}, {}  # per sequence: its blocks in order, its tokens

    def _take(self):
        block = self.free_list.pop()
        self.ref[block] = 1
        return block

    def allocate(self, seq_id, num_tokens):
        """Blocks for a new sequence's first ``num_tokens`` tokens."""
        self.tables[seq_id] = [self._take() for _ in range(ceil_div(num_tokens, self.block_size))]
        self.lengths[seq_id] = num_tokens

    def append_slot(self, seq_id):
        """A slot for the sequence's next token."""
        table, n = self.tables[seq_id], self.lengths[seq_id]
        if n % self.block_size == 0:  # the last block is full: a fresh one
            table.append(self._take())
        elif self.ref[table[-1]] > 1:  # shared with another sequence: copy it before writing
            shared, table[-1] = table[-1], self._take()
            self.ref[shared] -= 1
            self.copy_block(shared, table[-1])
        self.lengths[seq_id] = n + 1  # else: the only user writes in place

    def fork(self, parent_id, child_id):
        """A child sharing all of its parent's blocks."""
        self.tables[child_id] = list(self.tables[parent_id])  # the child's own list, the same blocks
        self.lengths[child_id] = self.lengths[parent_id]
        for block in self.tables[child_id]:
            self.ref[block] += 1

    def free(self, seq_id):
        """Release a sequence's blocks."""
        for block in self.tables.pop(seq_id):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free_list.append(block)
        del self.lengths[seq_id]

    def block_table(self, seq_id):
        """The sequence's blocks, in order."""
        return list(self.tables[seq_id])

    def ref_cnt(self, block_id):
        """How many block tables point at the block."""
        return self.ref[block_id]

    def num_free_blocks(self):
        """Blocks no table points at."""
        return len(self.free_list)


def solve_3_3():
    """The class itself: the check builds its own managers from it."""
    return SmallBlockManager


RUNS = ((0, 12, 4), (1, 20, 3), (2, 16, 2), (3, 10, 1))  # (seed, num_blocks, block_size) of each run
NUM_OPS = 120  # random operations per run, then every sequence is freed: about 500 in all
MAX_SEQS = 6
METHODS = ("allocate", "append_slot", "fork", "free", "block_table", "ref_cnt", "num_free_blocks")

HINTS = {  # on append_slot: (what kvlib's manager did, what the reader's did) -> the hint; then by name
    ("copy", "in place"): "no copy-on-write: the last block is shared (ref_cnt > 1), so writing into it "
    "would change what the other sequences read; take a new block, copy_block(shared, new), and write there",
    ("copy", "moved"): "you replaced the shared last block by a new one but never copied it: call "
    "copy_block(shared, new) so that the new block holds the tokens already written",
    ("copy", "new"): "the shared last block still has free slots: replace it in the table by a private copy "
    "instead of adding a block after it",
    ("in place", "copy"): "this block's ref_cnt is 1 now (the other sharers copied it or are gone): its only "
    "user writes in place; decide by the current ref_cnt, not by whether the block was ever shared",
    ("in place", "new"): "the last block still has free slots: a new block is needed only when it is full",
    ("new", "in place"): "the last block is full: take a new block from the free list for the next token",
    ("new", "copy"): "a full block is never written again: append a fresh block and copy nothing, even if "
    "the full block is shared",
    "round up": "you rounded down: a partly filled last block is still a whole block (ceil)",
    "aliased": "fork must give the child its own list (a copy of the parent's table): with one list "
    "shared, changing one sequence's table changed another's",
    "fork shares": "fork copies nothing: the child's table lists the parent's very blocks; a copy waits "
    "for the first write into a shared block (copy-on-write)",
    "fork counts": "fork adds one to the ref_cnt of every block the child now shares with its parent",
    "copy counts": "after copy-on-write the shared block has one user fewer: decrement its ref_cnt (the "
    "copy starts at 1)",
    "free counts": "ref counts not decremented on free: free subtracts one from the ref_cnt of each of the "
    "sequence's blocks, and a block whose count reaches 0 goes back to the free list",
    "free shared": "you freed blocks that other sequences still use: a block returns to the free list only "
    "when its ref_cnt reaches 0",
}


def _outcome(before: list, after: list, copies: list) -> str:
    """What an append_slot did to a block table: a new block, a copy, a move without copying, or nothing."""
    if after == before:
        return "in place"
    if after[:-1] == before and len(after) == len(before) + 1:
        return "new"
    if len(after) == len(before) and after[:-1] == before[:-1]:
        return "copy" if copies else "moved"
    return "other"


class _Observed:
    """A manager's state after an operation: block tables, ref_cnt of every block, free blocks."""

    def __init__(self, manager, seq_ids, num_blocks):
        self.tables = {s: _returned(manager.block_table(s), f"block_table({s})") for s in seq_ids}
        self.ref_cnt = [_returned(manager.ref_cnt(b), f"ref_cnt({b})", int) for b in range(num_blocks)]
        free = manager.num_free_blocks
        self.free = _returned(free() if callable(free) else free, "num_free_blocks()", int)


class _WrongReturn(Exception):
    """A method of the reader's class returned the wrong kind of value: the message is the hint."""


def _returned(value, call: str, kind: type = list):
    """``value`` if it is a list (or tuple, as a list) or an int as asked, else raise the hint."""
    if isinstance(value, kind if kind is int else (list, tuple)) and not isinstance(value, bool):
        return list(value) if kind is list else value
    what = "an int" if kind is int else "a list of block ids"
    raise _WrongReturn(f"{call} returned {value!r}"[:60] + f" ({type(value).__name__}), not {what}")


def _renaming(ref: _Observed, mine: _Observed, num_blocks: int) -> tuple[dict | None, str | None]:
    """The one-to-one naming of the reader's blocks onto kvlib's that makes the tables equal, else a hint."""
    to_ref, to_mine = {}, {}
    for seq, table in mine.tables.items():
        if len(table) != len(ref.tables[seq]):
            return None, f"block_table({seq}) has {len(table)} blocks where it needs {len(ref.tables[seq])}"
        if any(not isinstance(b, int) or not 0 <= b < num_blocks for b in table):
            return None, f"block_table({seq}) is {table}: block ids are ints from 0 to num_blocks - 1"
        for mine_block, ref_block in zip(table, ref.tables[seq], strict=True):
            if to_ref.setdefault(mine_block, ref_block) != ref_block:
                return None, f"your tables use block {mine_block} twice where the sequences need two blocks"
            if to_mine.setdefault(ref_block, mine_block) != mine_block:
                return (
                    None,
                    f"your tables hold two blocks ({to_mine[ref_block]}, {mine_block}) where one is shared",
                )
    return to_ref, None


def _diagnose(op, block_size, before, after, copies) -> str | None:
    """The first difference between kvlib's manager and the reader's after ``op``, as a hint; None if none.

    ``before`` and ``after``: (kvlib's, the reader's) :class:`_Observed` states; ``copies``: the
    (kvlib's, the reader's) copy_block calls of this operation.
    """
    (ref_before, mine_before), (ref, mine), (ref_copies, mine_copies) = before, after, copies
    name, *args = op
    if name == "allocate":
        seq, num_tokens = args
        if len(mine.tables[seq]) != len(ref.tables[seq]):
            if len(mine.tables[seq]) == num_tokens // block_size:
                return HINTS["round up"]
            return f"{num_tokens} tokens take {len(ref.tables[seq])} blocks, not {len(mine.tables[seq])}"
    if name == "append_slot":
        seq = args[0]
        expected = _outcome(ref_before.tables[seq], ref.tables[seq], ref_copies)
        got = _outcome(mine_before.tables[seq], mine.tables[seq], mine_copies)
        if got != expected:
            return HINTS.get(
                (expected, got),
                f"the table went from {mine_before.tables[seq]} to {mine.tables[seq]}: only the last block "
                "may be replaced, or one block added",
            )
        if mine_copies and mine_copies != [(mine_before.tables[seq][-1], mine.tables[seq][-1])]:
            return f"copy_block got {mine_copies}: copy the shared block (src) into its new copy (dst), once"
    if name == "fork" and (mine_copies or mine.tables[args[1]] != mine.tables[args[0]]):
        return HINTS["fork shares"]
    if mine_copies and not ref_copies:
        return f"copy_block was called ({mine_copies}) where nothing is copied: only copy-on-write copies"
    for seq, table in mine_before.tables.items():
        if seq in mine.tables and seq != args[0] and mine.tables[seq] != table:
            return HINTS["aliased"]
    to_ref, problem = _renaming(ref, mine, len(ref.ref_cnt))
    if problem:
        return problem
    for block, count in enumerate(mine.ref_cnt):
        expected = ref.ref_cnt[to_ref[block]] if block in to_ref else 0
        if count != expected:
            if name == "free" and count > expected:
                return HINTS["free counts"]
            if name == "fork" and count < expected:
                return HINTS["fork counts"]
            if name == "append_slot" and mine_copies and block == mine_copies[0][0]:
                return HINTS["copy counts"]
            return f"ref_cnt({block}) is {count!r}, expected {expected}: the number of tables pointing at it"
    if mine.free != ref.free:
        if name == "free":
            return HINTS["free shared"] if mine.free > ref.free else HINTS["free counts"]
        return f"num_free_blocks() is {mine.free!r}, expected {ref.free}: count the blocks no table uses"
    return None


def _next_operation(rng: random.Random, ref: BlockManager, next_id: int) -> tuple:
    """A random operation that fits in kvlib's pool: allocate, fork, append_slot or free."""
    live = sorted(ref.sequences)
    choices = []
    if len(live) < MAX_SEQS:
        num_tokens = rng.randint(1, 3 * ref.block_size)
        if ref.can_allocate([0] * num_tokens):
            choices += [("allocate", next_id, num_tokens)] * 2
        if live:
            choices += [("fork", rng.choice(live), next_id)] * 2
    appendable = [seq for seq in live if ref.can_append(seq)]
    if appendable:
        choices += [("append_slot", rng.choice(appendable))] * 4
    if live:
        choices.append(("free", rng.choice(live)))
    return rng.choice(choices)


def _apply_reference(ref: BlockManager, tokens: dict, op: tuple) -> None:
    """``op`` on kvlib's manager, whose caller owns the token lists (their values do not matter here)."""
    name, *args = op
    if name == "allocate":
        tokens[args[0]] = [0] * args[1]
        ref.allocate(args[0], tokens[args[0]])
    elif name == "append_slot":
        tokens[args[0]].append(0)
        ref.append_slot(args[0])
    elif name == "fork":
        tokens[args[1]] = ref.fork(*args)
    else:
        ref.free(args[0])
        del tokens[args[0]]
    for seq in ref.sequences:
        ref.mark_computed(seq)  # the model "ran": fork needs every token's K/V written


def _run(reader_class, seed: int, num_blocks: int, block_size: int) -> str | None:
    """One seeded run of operations on both managers; the first difference as a hint, else None."""
    copies: tuple[list, list] = ([], [])
    ref = BlockManager(
        num_blocks, block_size, False, copy_block=lambda src, dst: copies[0].append((src, dst))
    )
    rng, tokens, step, where = (
        random.Random(seed),
        {},
        0,
        f"{reader_class.__name__}({num_blocks}, {block_size})",
    )
    try:
        mine = reader_class(num_blocks, block_size, lambda src, dst: copies[1].append((src, dst)))
        before = (_Observed(ref, [], num_blocks), _Observed(mine, [], num_blocks))
        while step < NUM_OPS or ref.sequences:
            op = _next_operation(rng, ref, step) if step < NUM_OPS else ("free", min(ref.sequences))
            where = f"{op[0]}{tuple(op[1:])}".replace(",)", ")") + f" with blocks of {block_size}"
            copies[0].clear(), copies[1].clear()
            _apply_reference(ref, tokens, op)
            getattr(mine, op[0])(*op[1:])
            after = (_Observed(ref, ref.sequences, num_blocks), _Observed(mine, ref.sequences, num_blocks))
            problem = _diagnose(op, block_size, before, after, copies)
            if problem:
                return f"{where}: {problem}"
            before, step = after, step + 1
    except _WrongReturn as wrong:
        return f"after {where}: {wrong}"
    except Exception as error:  # the reader's code: report, do not crash
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != __file__]
        method = frames[-1].name if frames else "class"  # where in the reader's class it raised
        return f"{where}: your {method} raised {type(error).__name__}: {error}"
    return None


def check_3_3(answer):
    """Exercise 3.3: the reader's block manager class, against kvlib's on the same random operations.

    None if right, else a hint that names the likely mistake.
    """
    if not isinstance(answer, type):
        made = " an instance of it" if hasattr(answer, "allocate") else f" {type(answer).__name__}"
        return f"answer with the class itself (MyBlockManager: the check builds its own managers), not{made}"
    missing = [method for method in METHODS if not hasattr(answer, method)]
    if missing:
        return f"your class has no {', '.join(missing)}: write every method of the stub"
    for run in RUNS:
        problem = _run(answer, *run)
        if problem:
            return problem
    return None


# ---- the usual mistakes, one buggy class each (WRONG_CLASSES), and the words of the hint each gets


class _NoCopyOnWrite(SmallBlockManager):
    def append_slot(self, seq_id):  # writes into a shared block
        if self.lengths[seq_id] % self.block_size == 0:
            self.tables[seq_id].append(self._take())
        self.lengths[seq_id] += 1


class _FreeKeepsRefCounts(SmallBlockManager):
    def free(self, seq_id):  # hands back unshared blocks, decrements nothing
        self.free_list += [b for b in self.tables.pop(seq_id) if self.ref[b] == 1]
        del self.lengths[seq_id]


class _FreeSharedBlocks(SmallBlockManager):
    def free(self, seq_id):  # every block back to the free list, shared or not
        for block in self.tables.pop(seq_id):
            self.ref[block] -= 1
            self.free_list.append(block)
        del self.lengths[seq_id]


class _CopyWithoutDecrement(SmallBlockManager):
    def append_slot(self, seq_id):  # the shared block keeps its count after the copy
        table = self.tables[seq_id]
        shared, num_blocks = table[-1], len(table)
        super().append_slot(seq_id)
        if len(table) == num_blocks and table[-1] != shared:
            self.ref[shared] += 1


class _CopyOnceShared(SmallBlockManager):
    ever_shared = frozenset()

    def fork(self, parent_id, child_id):
        super().fork(parent_id, child_id)
        self.ever_shared |= set(self.tables[child_id])

    def append_slot(self, seq_id):  # copies a block that was ever shared, even by its last user
        last = self.tables[seq_id][-1]
        if self.lengths[seq_id] % self.block_size and last in self.ever_shared and self.ref[last] == 1:
            self.ref[last] += 1  # as if it were still shared: copy it
        super().append_slot(seq_id)


class _ForkCopies(SmallBlockManager):
    def fork(self, parent_id, child_id):  # copies every block at once instead of on the first write
        self.tables[child_id] = [self._take() for _ in self.tables[parent_id]]
        self.lengths[child_id] = self.lengths[parent_id]
        for src, dst in zip(self.tables[parent_id], self.tables[child_id], strict=True):
            self.copy_block(src, dst)


class _ForkWithoutRefCount(SmallBlockManager):
    def fork(self, parent_id, child_id):
        self.tables[child_id] = list(self.tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]


class _ForkSharesTheList(SmallBlockManager):
    def fork(self, parent_id, child_id):  # the child's table IS the parent's list
        super().fork(parent_id, child_id)
        self.tables[child_id] = self.tables[parent_id]


class _AllocateRoundsDown(SmallBlockManager):
    def allocate(self, seq_id, num_tokens):
        self.tables[seq_id] = [self._take() for _ in range(num_tokens // self.block_size)]
        self.lengths[seq_id] = num_tokens


WRONG_CLASSES = {  # buggy class -> words its hint contains
    _NoCopyOnWrite: "no copy-on-write",
    _FreeKeepsRefCounts: "ref counts not decremented on free",
    _FreeSharedBlocks: "other sequences still use",
    _CopyWithoutDecrement: "one user fewer",
    _CopyOnceShared: "not by whether the block was ever shared",
    _ForkCopies: "fork copies nothing",
    _ForkWithoutRefCount: "fork adds one to the ref_cnt",
    _ForkSharesTheList: "its own list",
    _AllocateRoundsDown: "rounded down",
}
