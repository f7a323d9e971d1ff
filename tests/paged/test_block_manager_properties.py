"""Property tests (hypothesis) of the paged KV cache.

A state machine drives a :class:`PagedKVCache` through random allocate / append / batched
decode / fork / free steps (it owns every sequence's token list, as callers do), with a
small token alphabet so that prefix-cache hits are frequent and a small pool so that
running out is frequent. The "model" writes K/V values that depend only on the token
prefix (as a real model's do), so every sequence knows what its stored K/V must be,
whoever computed them. After every step:

- every block is either free (ref_cnt 0, in the free queue) or referenced, never both;
- each block's ref_cnt equals the number of block-table entries pointing at it;
- the prefix cache maps each hash to a block carrying that hash;
- the stored K/V of every live sequence read back exactly what was written for its prefix
  (so no shared block was ever written in place: the cache also refuses such a write);
- attention through the block tables equals contiguous attention over the expected K/V.

Freeing everything at the end returns the pool to full.
"""

import zlib
from collections import Counter
from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlib.chapters.ch03_paged_attention.kernel_overhead import paged_vs_contiguous_error, random_decode_case
from kvlib.measure.timing import torch_threads
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.paged.usage import block_usage

CONFIG = ModelConfig(
    vocab_size=8, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, d_ff=8, max_seq_len=64
)
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=10)


@pytest.fixture(autouse=True)
def one_thread():
    """Thousands of tiny tensor operations: a second thread only adds synchronisation."""
    with torch_threads(1):
        yield


@cache
def kv_for(prefix: tuple[int, ...]) -> torch.Tensor:
    """K and V of the last token of ``prefix`` in every layer: (2, layers, kv_heads, head_dim)."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr(prefix).encode()))
    return torch.randn(2, CONFIG.num_layers, CONFIG.num_kv_heads, CONFIG.head_dim, generator=gen)


def expected_kv(token_ids: list[int], num: int) -> torch.Tensor:
    """(2, layers, kv_heads, num, head_dim): what the first ``num`` tokens' K/V must be."""
    if num == 0:
        return torch.zeros(2, CONFIG.num_layers, CONFIG.num_kv_heads, 0, CONFIG.head_dim)
    return torch.stack([kv_for(tuple(token_ids[: p + 1])) for p in range(num)], dim=3)


class PagedCacheMachine(RuleBasedStateMachine):
    @initialize(block_size=st.integers(1, 4), num_blocks=st.integers(1, 12), prefix_caching=st.booleans())
    def setup(self, block_size, num_blocks, prefix_caching):
        self.cache = PagedKVCache(CONFIG, num_blocks, block_size, enable_prefix_caching=prefix_caching)
        self.manager = self.cache.manager
        self.tokens: dict[int, list[int]] = {}  # seq_id -> its token list, which the manager reads
        self.next_id = 0
        self.q_gen = torch.Generator().manual_seed(0)

    # ------------------------------------------------------------ a fake forward pass

    def forward(self, seq_ids):
        """Write the pending tokens' K/V through the cache protocol and check the attention output."""
        manager = self.manager
        pending = {len(manager.token_ids(s)) - manager.num_computed(s) for s in seq_ids}
        assert len(pending) == 1
        num_new = pending.pop()
        starts = [manager.num_computed(s) for s in seq_ids]
        self.cache.schedule(seq_ids)
        positions = self.cache.prepare(num_new)
        assert positions.tolist() == [list(range(s, s + num_new)) for s in starts]
        full = [expected_kv(manager.token_ids(s), len(manager.token_ids(s))) for s in seq_ids]
        for layer in range(CONFIG.num_layers):
            q = torch.randn(len(seq_ids), CONFIG.num_heads, num_new, CONFIG.head_dim, generator=self.q_gen)
            k = torch.stack(
                [kv[0, layer, :, start:] for kv, start in zip(full, starts, strict=True)]
            )  # (batch, kv_heads, new, head_dim)
            v = torch.stack([kv[1, layer, :, start:] for kv, start in zip(full, starts, strict=True)])
            out = self.cache.attend(layer, q, k, v)
            for b, kv in enumerate(full):
                ref = grouped_attention(
                    q[b : b + 1], kv[0, layer][None], kv[1, layer][None], q_start=starts[b]
                )
                assert torch.allclose(out[b : b + 1], ref, atol=1e-5)
        assert all(manager.num_computed(s) == len(manager.token_ids(s)) for s in seq_ids)

    def live(self):
        return sorted(self.manager.sequences)

    # ------------------------------------------------------------ operations

    def try_append(self, seq_id, token):
        """Append a token and give it a slot; take it back if no block is free."""
        self.tokens[seq_id].append(token)
        slot = self.manager.append_slot(seq_id)
        if slot is None:
            self.tokens[seq_id].pop()
        return slot

    @rule(prompt=TOKENS)
    def allocate(self, prompt):
        seq_id, self.next_id = self.next_id, self.next_id + 1
        prompt = self.tokens[seq_id] = list(prompt)
        free_before = self.manager.num_free_blocks
        if not self.manager.can_allocate(prompt):
            assert self.manager.allocate(seq_id, prompt) is None
            assert seq_id not in self.manager and self.manager.num_free_blocks == free_before
            return
        allocation = self.manager.allocate(seq_id, prompt)
        assert allocation is not None
        assert self.manager.token_ids(seq_id) == prompt
        cached = allocation.num_cached_tokens
        assert cached % self.manager.block_size == 0 and cached <= len(prompt) - 1
        assert cached == 0 or self.manager.enable_prefix_caching
        self.forward([seq_id])

    @rule(first=TOKENS, shared=st.integers(0, 10), tail=TOKENS)
    def allocate_two_then_prefill(self, first, shared, tail):
        """Two requests with a common prefix admitted before either runs: the second must
        not reuse blocks whose K/V the first has not computed yet."""
        ids = []
        for prompt in (first, first[:shared] + tail):
            seq_id, self.next_id = self.next_id, self.next_id + 1
            self.tokens[seq_id] = list(prompt)
            if self.manager.allocate(seq_id, self.tokens[seq_id]) is not None:
                ids.append(seq_id)
        for seq_id in reversed(ids):
            self.forward([seq_id])

    @precondition(lambda self: self.manager.sequences)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data, token):
        seq_id = data.draw(st.sampled_from(self.live()))
        before = self.manager.token_ids(seq_id)
        if not self.manager.can_append(seq_id):
            assert self.try_append(seq_id, token) is None
            assert self.manager.token_ids(seq_id) == before
            return
        slot = self.try_append(seq_id, token)
        assert self.manager.token_ids(seq_id) == before + [token]
        assert self.manager.ref_cnt(slot // self.manager.block_size) == 1  # never a shared block
        self.forward([seq_id])

    @precondition(lambda self: len(self.manager.sequences) >= 2)
    @rule(data=st.data())
    def decode_batch(self, data):
        chosen = data.draw(st.lists(st.sampled_from(self.live()), min_size=2, max_size=4, unique=True))
        batch = []
        for seq_id in chosen:
            if self.try_append(seq_id, data.draw(st.integers(0, 2))) is not None:
                batch.append(seq_id)
        if batch:
            self.forward(batch)

    @precondition(lambda self: self.manager.sequences)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live()))
        child, self.next_id = self.next_id, self.next_id + 1
        free_before = self.manager.num_free_blocks
        self.tokens[child] = self.manager.fork(parent, child)
        assert self.tokens[child] == self.tokens[parent] and self.tokens[child] is not self.tokens[parent]
        assert self.manager.block_table(child) == self.manager.block_table(parent)
        assert self.manager.num_free_blocks == free_before

    @precondition(lambda self: self.manager.sequences)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(self.live()))
        self.manager.free(seq_id)
        del self.tokens[seq_id]

    # ------------------------------------------------------------ invariants

    @invariant()
    def reference_counts_match_block_tables(self):
        if not hasattr(self, "manager"):
            return
        pointers = Counter(b for seq in self.manager.sequences.values() for b in seq.block_table)
        free = set(self.manager.pool.free_queue.block_ids())
        for block in self.manager.pool.blocks:
            assert block.ref_cnt == pointers[block.block_id]
            assert (block.ref_cnt == 0) == (block.block_id in free)
        assert len(free) + len(pointers) == self.manager.num_blocks

    @invariant()
    def prefix_cache_is_consistent(self):
        if not hasattr(self, "manager"):
            return
        for block_hash, block in self.manager.pool.cached.items():
            assert block.block_hash == block_hash
        hashed = [b for b in self.manager.pool.blocks if b.block_hash is not None]
        assert len(hashed) == len(self.manager.pool.cached)

    @invariant()
    def stored_kv_reads_back_what_was_written(self):
        if not hasattr(self, "manager"):
            return
        for seq_id in self.live():
            assert self.manager.token_ids(seq_id) == self.tokens[seq_id]  # every token has a slot
            tokens, num = self.manager.token_ids(seq_id), self.manager.num_computed(seq_id)
            expected = expected_kv(tokens, num)
            for layer in range(CONFIG.num_layers):
                k, v = self.cache.read(seq_id, layer)
                assert torch.equal(k, expected[0, layer]) and torch.equal(v, expected[1, layer])

    def teardown(self):
        if not hasattr(self, "manager"):
            return
        for seq_id in self.live():
            self.manager.free(seq_id)
        usage = block_usage(self.manager)
        assert usage.num_free_blocks == usage.num_blocks and usage.num_used_blocks == 0
        assert all(b.ref_cnt == 0 for b in self.manager.pool.blocks)


PagedCacheMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_paged_cache_state_machine = PagedCacheMachine.TestCase


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 70), min_size=1, max_size=4),
    block_size=st.sampled_from([1, 2, 5, 16, 32, 64]),
    heads=st.sampled_from([(4, 4), (4, 2), (4, 1), (6, 3)]),
    num_new=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_paged_attention_equals_contiguous_for_random_shapes(lengths, block_size, heads, num_new, seed):
    num_new = min(num_new, min(lengths))
    case = random_decode_case(lengths, block_size, heads[0], heads[1], head_dim=8, num_new=num_new, seed=seed)
    assert paged_vs_contiguous_error(case) < 1e-5
