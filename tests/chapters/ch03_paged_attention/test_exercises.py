"""Chapter 3's exercises beyond tests/test_exercises.py: the answers worked out by hand, the buggy
block managers and gathers each named by its hint, and the random operations of exercise 3.3
reaching every path of copy-on-write."""

import numpy as np
import pytest
import torch

from kvlib.chapters.ch03_paged_attention.block_manager_exercise import (
    RUNS,
    WRONG_CLASSES,
    SmallBlockManager,
    check_3_3,
)
from kvlib.chapters.ch03_paged_attention.exercises import WRONG_ANSWERS
from kvlib.chapters.exercises import check
from kvlib.paged.block_manager import BlockManager


def test_the_answers_worked_out_by_hand_pass():
    # 3.1: 63 + 3 + 1 + 1 = 68 blocks; 68 x 16 - 1,054 = 34 empty slots x 2 x 40 x 5,120 x 2 = 819,200 bytes
    # = 27,852,800 bytes = 26.5625 MiB; reserving 4 x 2,048 = 8,192 slots: 1 - 1,054 / 8,192 = 0.871337890625
    assert check("3.1", (68, 26.5625, 0.871337890625)).ok
    assert check("3.1", [68, 26.56, 0.8713]).ok  # rounded as a reader writes them
    # 3.2: 3 blocks (16 + 16 + 5), the last copied by the first three branches to append: 3 + 3
    assert check("3.2", 6).ok
    # 3.4: blocks 0-5 (tokens 0-95) lie inside the 100-token system prompt
    assert check("3.4", 96).ok


def test_a_triple_in_numpy_or_torch_form_passes():
    for answer in [
        np.array([68, 26.5625, 0.871337890625]),
        torch.tensor([68.0, 26.5625, 0.8713]),
        (np.int64(68), np.float64(26.5625), torch.tensor(0.8713)),
    ]:
        assert check("3.1", answer).ok, type(answer)


@pytest.mark.parametrize(
    "answer, words",
    [
        ((65, 26.5625, 0.8713), "blocks: you rounded down"),
        ((68, 13.28125, 0.8713), "MiB: a token stores a key AND a value"),
        ((68, 53.125, 0.8713), "MiB: fp16 takes 2 bytes"),
        ((68, 26.5625, 87.13), "fraction: give a fraction between 0 and 1"),
        (68, "three numbers"),
        ((68, 26.5625), "three numbers"),
    ],
)
def test_each_part_of_3_1_names_its_mistake(answer, words):
    feedback = check("3.1", answer)
    assert not feedback.ok and words in feedback.message, feedback.message


# ---------------------------------------------------------------- 3.3 the block manager


@pytest.mark.parametrize("buggy", list(WRONG_CLASSES), ids=lambda cls: cls.__name__)
def test_each_buggy_block_manager_gets_its_own_hint(buggy):
    feedback = check("3.3", buggy)
    assert not feedback.ok and WRONG_CLASSES[buggy] in feedback.message, feedback.message
    others = [words for cls, words in WRONG_CLASSES.items() if cls is not buggy]
    assert not any(words in feedback.message for words in others), feedback.message


class _FirstInFirstOut(SmallBlockManager):
    """Right, with other block names than kvlib's: blocks leave the free list from its front."""

    def _take(self):
        block = self.free_list.pop(0)
        self.ref[block] = 1
        return block

    @property
    def num_free_blocks(self):  # a property, as kvlib's manager has it
        return len(self.free_list)


class _Library:
    """kvlib's own manager behind the exercise's interface: the check agrees with the library."""

    def __init__(self, num_blocks, block_size, copy_block):
        self.manager = BlockManager(
            num_blocks, block_size, enable_prefix_caching=False, copy_block=copy_block
        )
        self.tokens = {}

    def allocate(self, seq_id, num_tokens):
        self.tokens[seq_id] = [0] * num_tokens
        self.manager.allocate(seq_id, self.tokens[seq_id])
        self.manager.mark_computed(seq_id)

    def append_slot(self, seq_id):
        self.tokens[seq_id].append(0)
        self.manager.append_slot(seq_id)
        self.manager.mark_computed(seq_id)

    def fork(self, parent_id, child_id):
        self.tokens[child_id] = self.manager.fork(parent_id, child_id)

    def free(self, seq_id):
        self.manager.free(seq_id)

    def block_table(self, seq_id):
        return self.manager.block_table(seq_id)

    def ref_cnt(self, block_id):
        return self.manager.ref_cnt(block_id)

    def num_free_blocks(self):
        return self.manager.num_free_blocks


@pytest.mark.parametrize("right", [SmallBlockManager, _FirstInFirstOut, _Library], ids=lambda c: c.__name__)
def test_right_managers_pass_whatever_they_name_their_blocks(right):
    assert check("3.3", right).ok


class _Counting(SmallBlockManager):
    """The reference, counting what each operation did."""

    counts: dict = {}

    def _count(self, what):
        self.counts[what] = self.counts.get(what, 0) + 1

    def append_slot(self, seq_id):
        table, n = self.tables[seq_id], self.lengths[seq_id]
        if n % self.block_size == 0:
            self._count("new block")
        elif self.ref[table[-1]] > 1:
            self._count("copy")
        elif table[-1] in self.copied_from:
            self._count("in place, once shared")  # the last sharer of a block the others copied
        else:
            self._count("in place")
        shared = table[-1] if n % self.block_size and self.ref[table[-1]] > 1 else None
        super().append_slot(seq_id)
        if shared is not None:
            self.copied_from.add(shared)

    def fork(self, parent_id, child_id):
        self._count("fork")
        super().fork(parent_id, child_id)

    def free(self, seq_id):
        self._count("free shared" if any(self.ref[b] > 1 for b in self.tables[seq_id]) else "free")
        super().free(seq_id)

    def __init__(self, *args):
        super().__init__(*args)
        self.copied_from = set()


def test_the_random_operations_reach_every_path():
    _Counting.counts = {}
    assert check_3_3(_Counting) is None
    counts = _Counting.counts
    assert set(counts) == {
        "new block",
        "copy",
        "in place, once shared",
        "in place",
        "fork",
        "free",
        "free shared",
    }
    assert all(n >= 5 for n in counts.values()), counts
    assert 300 <= sum(counts.values()) <= 1_000, counts  # a few hundred operations
    assert len(RUNS) >= 3 and {run[2] for run in RUNS} >= {1, 4}  # blocks of 1 token never copy


def test_the_blank_stub_and_a_raising_method_get_a_hint_not_a_crash():
    class Stub:  # the exercise's cell as the reader finds it
        def __init__(self, num_blocks, block_size, copy_block): ...
        def allocate(self, seq_id, num_tokens): ...
        def append_slot(self, seq_id): ...
        def fork(self, parent_id, child_id): ...
        def free(self, seq_id): ...
        def block_table(self, seq_id): ...
        def ref_cnt(self, block_id): ...
        def num_free_blocks(self): ...

    assert "ref_cnt(0) returned None (NoneType), not an int" in check("3.3", Stub).message

    class Raises(SmallBlockManager):
        def fork(self, parent_id, child_id):
            raise ValueError("not yet")

    assert "your fork raised ValueError: not yet" in check("3.3", Raises).message

    class Incomplete:
        def __init__(self, num_blocks, block_size, copy_block): ...

    assert "your class has no allocate" in check("3.3", Incomplete).message
    assert "not an instance of it" in check("3.3", SmallBlockManager(4, 4, print)).message


# ---------------------------------------------------------------- 3.5 the gather


def test_other_right_gathers_pass():
    def by_token(k_pool, block_table, length):
        block_size = k_pool.shape[1]
        return torch.stack([k_pool[block_table[j // block_size], j % block_size] for j in range(length)])

    def by_cat(k_pool, block_table, length):
        return torch.cat([k_pool[b] for b in block_table])[:length]

    assert check("3.5", by_token).ok and check("3.5", by_cat).ok


@pytest.mark.parametrize(
    "index, words",
    [
        (0, "keep only the first `length` rows"),
        (1, "join the block and slot axes"),
        (2, "look each logical block up in the block table"),
        (3, "each block holds block_size consecutive tokens"),
        (4, "off by one"),
        (5, "it converts nothing"),
        (6, "not a torch tensor"),
        (7, "answer with a function gather"),
    ],
)
def test_each_wrong_gather_gets_its_hint(index, words):
    feedback = check("3.5", WRONG_ANSWERS["3.5"][index])
    assert not feedback.ok and words in feedback.message, feedback.message


def test_a_gather_that_writes_into_the_pool_is_told():
    def zeroing(k_pool, block_table, length):
        out = k_pool[block_table].flatten(0, 1)[:length].clone()
        k_pool.zero_()
        return out

    assert "changed the pool" in check("3.5", zeroing).message


def test_the_reference_manager_reproduces_exercise_3_2():
    """As the worked solution of 3.3 says: 37 tokens, three forks, one append each: 6 blocks in use."""
    copies = []
    manager = SmallBlockManager(32, 16, lambda src, dst: copies.append((src, dst)))
    manager.allocate(0, 37)
    for child in (1, 2, 3):
        manager.fork(0, child)
    for seq in range(4):
        manager.append_slot(seq)
    assert 32 - manager.num_free_blocks() == 6 and len(copies) == 3
