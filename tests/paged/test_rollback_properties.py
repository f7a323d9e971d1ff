"""Property tests (hypothesis) of rollback in the block manager (chapter 8's speculative decoding).

A state machine runs random interleavings of allocate / append / speculate k and accept a <= k /
truncate / fork / free on a small pool, and mirrors every step on a reference manager with a
large pool that only ever sees plain appends of the tokens that were accepted. The "K/V" of a
slot is the token prefix it was computed for, written only through the slots the manager
hands out (copy-on-write copies them), so a block that changed under a published hash is
caught. After every step:

- free + used blocks = all blocks, and each block's ref_cnt = the block tables holding it;
- every published hash is the chained hash of verified tokens, and its block holds the K/V
  of exactly those tokens (no draft token, rejected or not, is ever findable);
- every live sequence reads back the K/V of its own prefix (no shared block was written);
- every live sequence equals its reference: tokens, computed count, block hashes, blocks.
"""

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlib.paged.block_manager import BlockManager
from kvlib.paged.block_pool import hash_block_tokens

TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=8)  # few values: frequent prefix hits
REFERENCE_BLOCKS = 4096  # the reference never runs out nor evicts in a run of this length


def chained_hash(prefix: tuple[int, ...], block_size: int) -> str | None:
    """The published hash of the block that ends ``prefix`` (a whole number of blocks)."""
    parent = None
    for i in range(len(prefix) // block_size):
        parent = hash_block_tokens(parent, prefix[i * block_size : (i + 1) * block_size])
    return parent


class RollbackMachine(RuleBasedStateMachine):
    @initialize(block_size=st.integers(1, 4), num_blocks=st.integers(2, 10), prefix_caching=st.booleans())
    def setup(self, block_size, num_blocks, prefix_caching):
        self.kv: dict[int, tuple[int, ...]] = {}  # slot -> the token prefix whose K/V it holds
        self.manager = BlockManager(num_blocks, block_size, prefix_caching, copy_block=self.copy_block)
        self.reference = BlockManager(REFERENCE_BLOCKS, block_size, prefix_caching)
        self.tokens: dict[int, list[int]] = {}  # the lists the manager reads
        self.ref_tokens: dict[int, list[int]] = {}  # the reference's own lists
        self.verified: set[tuple[int, ...]] = set()  # every prefix of verified tokens seen
        self.next_id = 0

    def copy_block(self, src, dst):
        size = self.manager.block_size
        for i in range(size):
            self.kv[dst * size + i] = self.kv.get(src * size + i)

    def compute(self, seq_id):
        """A forward pass: write the K/V of the tokens without any, then mark them computed."""
        manager, tokens = self.manager, self.tokens[seq_id]
        for pos in range(manager.num_computed(seq_id), manager.num_tokens(seq_id)):
            slot = manager.slot(seq_id, pos)
            assert manager.ref_cnt(slot // manager.block_size) == 1  # never a shared block
            self.kv[slot] = tuple(tokens[: pos + 1])
        manager.mark_computed(seq_id)

    def verify(self, seq_id):
        """The sequence's tokens are all verified: note their prefixes, mirror them on the reference."""
        tokens = self.tokens[seq_id]
        self.verified.update(tuple(tokens[:n]) for n in range(1, len(tokens) + 1))
        ref = self.ref_tokens[seq_id]
        for token in tokens[len(ref) :]:
            ref.append(token)
            assert self.reference.append_slot(seq_id) is not None
        self.reference.mark_computed(seq_id)

    def live(self):
        return sorted(self.manager.sequences)

    # ------------------------------------------------------------ operations

    @rule(prompt=TOKENS)
    def allocate(self, prompt):
        seq_id, self.next_id = self.next_id, self.next_id + 1
        self.tokens[seq_id] = list(prompt)
        if self.manager.allocate(seq_id, self.tokens[seq_id]) is None:
            del self.tokens[seq_id]
            return
        self.ref_tokens[seq_id] = list(prompt)
        self.reference.allocate(seq_id, self.ref_tokens[seq_id])
        self.compute(seq_id)
        self.verify(seq_id)

    @precondition(lambda self: self.manager.sequences)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data, token):
        seq_id = data.draw(st.sampled_from(self.live()))
        self.tokens[seq_id].append(token)
        if self.manager.append_slot(seq_id) is None:
            self.tokens[seq_id].pop()
            return
        self.compute(seq_id)
        self.verify(seq_id)

    @precondition(lambda self: self.manager.sequences)
    @rule(data=st.data(), drafts=TOKENS, accepted=st.integers(0, 8), run=st.booleans())
    def speculate(self, data, drafts, accepted, run):
        """k draft tokens get slots (as many as fit), maybe a verification pass, then a <= k are kept."""
        seq_id = data.draw(st.sampled_from(self.live()))
        manager, tokens = self.manager, self.tokens[seq_id]
        start = len(tokens)
        for token in drafts:
            tokens.append(token)
            if manager.append_slot(seq_id, speculative=True) is None:
                tokens.pop()
                break
        if run:
            self.compute(seq_id)  # the target's pass over the drafts writes their K/V too
        kept = min(accepted, len(tokens) - start)
        manager.accept(seq_id, kept)
        del tokens[start + kept :]
        assert manager.num_speculative(seq_id) == 0 and manager.num_tokens(seq_id) == len(tokens)
        self.compute(seq_id)
        self.verify(seq_id)

    @precondition(lambda self: self.manager.sequences)
    @rule(data=st.data(), keep=st.integers(1, 12))
    def truncate(self, data, keep):
        """A general rollback, into verified tokens too; the reference starts the shorter sequence afresh."""
        seq_id = data.draw(st.sampled_from(self.live()))
        keep = min(keep, len(self.tokens[seq_id]))
        self.manager.truncate(seq_id, keep)
        del self.tokens[seq_id][keep:]
        self.reference.free(seq_id)
        self.ref_tokens[seq_id] = list(self.tokens[seq_id])
        self.reference.allocate(seq_id, self.ref_tokens[seq_id])
        self.reference.mark_computed(seq_id)

    @precondition(lambda self: self.manager.sequences)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live()))
        child, self.next_id = self.next_id, self.next_id + 1
        self.tokens[child] = self.manager.fork(parent, child)
        self.ref_tokens[child] = self.reference.fork(parent, child)

    @precondition(lambda self: self.manager.sequences)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(self.live()))
        self.manager.free(seq_id)
        self.reference.free(seq_id)
        del self.tokens[seq_id], self.ref_tokens[seq_id]

    # ------------------------------------------------------------ invariants

    @invariant()
    def blocks_add_up_and_ref_cnt_counts_tables(self):
        if not hasattr(self, "manager"):
            return
        pointers = Counter(b for seq in self.manager.sequences.values() for b in seq.block_table)
        free = set(self.manager.pool.free_queue.block_ids())
        for block in self.manager.pool.blocks:
            assert block.ref_cnt == pointers[block.block_id]
            assert (block.ref_cnt == 0) == (block.block_id in free)
        assert len(free) + len(pointers) == self.manager.num_blocks

    @invariant()
    def published_hashes_are_verified_tokens(self):
        if not hasattr(self, "manager"):
            return
        size = self.manager.block_size
        for block_hash, block in self.manager.pool.cached.items():
            assert block.block_hash == block_hash
            prefix = self.kv[block.block_id * size + size - 1]  # what the block's last slot holds
            assert prefix in self.verified and chained_hash(prefix, size) == block_hash
            start = len(prefix) - size
            assert [self.kv[block.block_id * size + i] for i in range(size)] == [
                prefix[: start + i + 1] for i in range(size)
            ]

    @invariant()
    def sequences_read_their_own_kv_and_equal_the_reference(self):
        if not hasattr(self, "manager"):
            return
        manager, reference = self.manager, self.reference
        assert sorted(reference.sequences) == self.live()
        for seq_id in self.live():
            tokens = self.tokens[seq_id]
            assert manager.token_ids(seq_id) == tokens == reference.token_ids(seq_id)
            assert manager.num_computed(seq_id) == len(tokens) == reference.num_computed(seq_id)
            assert manager.num_speculative(seq_id) == 0
            assert manager.sequences[seq_id].block_hashes == reference.sequences[seq_id].block_hashes
            assert len(manager.block_table(seq_id)) == len(reference.block_table(seq_id))
            for pos in range(len(tokens)):
                assert self.kv[manager.slot(seq_id, pos)] == tuple(tokens[: pos + 1])

    def teardown(self):
        if not hasattr(self, "manager"):
            return
        for seq_id in self.live():
            self.manager.free(seq_id)
        assert self.manager.num_free_blocks == self.manager.num_blocks
        assert all(b.ref_cnt == 0 for b in self.manager.pool.blocks)


RollbackMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_rollback_state_machine = RollbackMachine.TestCase
