"""Speculative decoding over the paged cache (kvlib.serving.speculative, chapter 8): greedy output
identical to plain greedy decoding, the counts of a draft that always agrees worked out by hand,
a batch of sequences left as plain decode steps leave them, both caches rolled back, errors."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.speculative_bench import layer_draft
from kvlib.measure.timing import torch_threads
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_pool import hash_block_tokens
from kvlib.paged.decode_loop import generate_paged, prefill
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.speculative import (
    free_draft,
    generate_speculative,
    speculative_decode,
    speculative_step,
)
from kvlib.serving.traces import Request
from kvlib.serving.types import SeqState

TARGET = TinyLlama(
    ModelConfig(
        vocab_size=61, d_model=32, num_layers=3, num_heads=4, num_kv_heads=2, d_ff=64, max_seq_len=96, seed=4
    )
)
SKIP = layer_draft(TARGET, [0, 2])  # guesses right now and then
SAME = layer_draft(TARGET, [0, 1, 2])  # the target itself: every guess is right
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12], [4]]


@pytest.fixture(autouse=True)
def one_thread():
    with torch_threads(1):
        yield


@pytest.mark.parametrize("k", [0, 1, 3, 5])
@pytest.mark.parametrize("draft", [SKIP, SAME], ids=["skip", "same"])
def test_tokens_equal_plain_greedy_decoding(draft, k):
    proposed = accepted = 0
    for prompt in PROMPTS:
        plain = generate_paged(TARGET, [prompt], 21, block_size=4).tokens[0]
        run = generate_speculative(TARGET, draft, prompt, 21, k, block_size=4)
        assert run.tokens == plain and run.num_new == 21
        proposed, accepted = proposed + run.num_proposed, accepted + run.num_accepted
    if draft is SKIP and k:
        assert 0 < accepted < proposed  # guesses were kept and rolled back


def test_a_draft_that_always_agrees_gives_k_plus_one_tokens_per_pass():
    run = generate_speculative(TARGET, SAME, PROMPTS[0], 20, 3, block_size=4)
    # the prefill gives token 1; then rounds of 3 guesses + 1: 19 = 4 + 4 + 4 + 4 + 3, the last capped
    assert run.num_target_passes == 1 + 5
    assert run.num_proposed == 4 * 3 + 2 and run.num_accepted == 14 and run.acceptance_rate == 1.0
    # draft passes: round 1 prefills the prompt and its first token (1 pass) then 2 more guesses;
    # each later round catches up on the last guess and the bonus token (1 pass) and guesses twice more
    assert run.num_draft_passes == 3 + 3 + 3 + 3 + 2
    assert run.tokens_per_target_pass == 20 / 6
    # peaks: the last round starts from 7 + 1 + 16 = 24 slots and slots 2 guesses: ceil(26 / 4) = 7
    # blocks; the draft then holds the 24 tokens and its first guess: ceil(25 / 4) = 7 blocks
    assert run.num_target_blocks == 7 and run.num_draft_blocks == 7
    # bytes per block: 2 (K, V) x 3 layers x 4 slots x 2 kv heads x 8 dims x 4 bytes = 1,536, in
    # both caches (this draft keeps all 3 layers)
    assert run.kv_bytes == 7 * 1536 + 7 * 1536


def test_without_guesses_each_pass_gives_one_token():
    run = generate_speculative(TARGET, SKIP, PROMPTS[1], 9, 0, block_size=4)
    assert (run.num_target_passes, run.num_draft_passes, run.num_proposed) == (9, 0, 0)
    assert run.acceptance_rate == 0.0 and run.tokens_per_target_pass == 1.0


def start(cache, prompts):
    """SeqStates whose prompt is prefilled and whose first token holds an uncomputed slot."""
    seqs = []
    for i, prompt in enumerate(prompts):
        seq = SeqState(Request(i, 0.0, tuple(prompt), 30), list(prompt))
        allocation = cache.manager.allocate(i, seq.tokens)
        seq.tokens.append(int(prefill(TARGET, cache, i, seq.tokens, allocation.num_cached_tokens).argmax()))
        cache.manager.append_slot(i)
        seqs.append(seq)
    return seqs


def test_a_batch_decodes_as_plain_greedy_and_leaves_the_caches_as_plain_steps_do():
    target_cache = PagedKVCache.for_model(TARGET, 40, 4)
    draft_cache = PagedKVCache.for_model(SKIP, 40, 4)
    seqs = start(target_cache, PROMPTS)
    caps = [30, 6, 11]
    while any(len(s.generated) < c for s, c in zip(seqs, caps, strict=True)):
        batch = [s for s, c in zip(seqs, caps, strict=True) if len(s.generated) < c]
        left = [c - len(s.generated) for s, c in zip(seqs, caps, strict=True) if len(s.generated) < c]
        before = [len(s.tokens) for s in batch]
        new = speculative_decode(TARGET, SKIP, target_cache, draft_cache, batch, 4, left)
        for seq, tokens, n, most in zip(batch, new, before, left, strict=True):
            assert 1 <= len(tokens) <= min(5, most) and seq.tokens[n:] == tokens
            manager = target_cache.manager
            assert manager.num_tokens(seq.seq_id) == manager.num_computed(seq.seq_id) == len(seq.tokens) - 1
            assert manager.num_speculative(seq.seq_id) == 0
            assert draft_cache.manager.num_tokens(seq.seq_id) <= len(seq.tokens)
            if len(seq.generated) < caps[seq.seq_id]:
                manager.append_slot(seq.seq_id)  # what the scheduler's memory does before the next step
    for seq, cap in zip(seqs, caps, strict=True):
        assert seq.tokens == generate_paged(TARGET, [seq.request.prompt], cap, block_size=4).tokens[0]
        # every published hash is that of the sequences' own (verified) blocks
    verified = set()
    for seq in seqs:
        parent = None
        for i in range((len(seq.tokens) - 1) // 4):
            parent = hash_block_tokens(parent, seq.tokens[4 * i : 4 * i + 4])
            verified.add(parent)
    assert set(target_cache.manager.pool.cached) <= verified and target_cache.manager.pool.cached
    for seq in seqs:
        target_cache.manager.free(seq.seq_id)
        free_draft(draft_cache, seq)
        free_draft(draft_cache, seq)  # a second time: nothing left to free
    assert target_cache.manager.num_free_blocks == draft_cache.manager.num_free_blocks == 40


def test_the_kept_kv_are_those_plain_decoding_writes():
    target_cache = PagedKVCache.for_model(TARGET, 12, 4)
    draft_cache = PagedKVCache.for_model(SKIP, 12, 4)
    (seq,) = start(target_cache, [PROMPTS[1]])
    while True:
        speculative_decode(TARGET, SKIP, target_cache, draft_cache, [seq], 3, [15 - len(seq.generated)])
        if len(seq.generated) == 15:
            break
        target_cache.manager.append_slot(0)
    plain = generate_paged(TARGET, [PROMPTS[1]], 15, block_size=4).cache
    for layer in range(3):
        for got, want in zip(target_cache.read(0, layer), plain.read(0, layer), strict=True):
            assert got.shape == want.shape == (2, 12 + 15 - 1, 8)  # (kv_heads, tokens with K/V, head_dim)
            assert torch.allclose(got, want, atol=1e-5)


def test_a_full_draft_cache_only_stops_the_guessing():
    target_cache = PagedKVCache.for_model(TARGET, 12, 4)
    draft_cache = PagedKVCache.for_model(SKIP, 1, 4)  # 4 slots: the 12-token prompt does not fit
    (seq,) = start(target_cache, [PROMPTS[1]])
    step = speculative_step(TARGET, SKIP, target_cache, draft_cache, [seq], 3)
    assert step.num_proposed == [0] and step.num_draft_passes == 0 and len(step.new_tokens[0]) == 1
    assert seq.tokens == generate_paged(TARGET, [PROMPTS[1]], 2, block_size=4).tokens[0]


def test_bad_calls_are_one_line_errors():
    target_cache = PagedKVCache.for_model(TARGET, 12, 4)
    draft_cache = PagedKVCache.for_model(SKIP, 12, 4)
    (seq,) = start(target_cache, [PROMPTS[0]])
    with pytest.raises(KVLibError, match="k must be an integer >= 0"):
        speculative_decode(TARGET, SKIP, target_cache, draft_cache, [seq], -1)
    with pytest.raises(KVLibError, match="max_new has 2 entries for 1 sequences"):
        speculative_decode(TARGET, SKIP, target_cache, draft_cache, [seq], 2, [3, 3])
    with pytest.raises(KVLibError, match="max_new must be an integer >= 1"):
        speculative_decode(TARGET, SKIP, target_cache, draft_cache, [seq], 2, [0])
    with pytest.raises(KVLibError, match="the draft cache is not shaped for the draft model"):
        speculative_decode(TARGET, SKIP, target_cache, target_cache, [seq], 2)
    with pytest.raises(KVLibError, match="caches of their own"):
        speculative_decode(TARGET, SAME, target_cache, target_cache, [seq], 2)
    with pytest.raises(KVLibError, match="non-empty list of SeqState"):
        speculative_decode(TARGET, SKIP, target_cache, draft_cache, [], 2)
    seq.tokens.append(3)  # a newest token without a slot
    with pytest.raises(KVLibError, match="must hold a slot in the target cache"):
        speculative_decode(TARGET, SKIP, target_cache, draft_cache, [seq], 2)
    other = TinyLlama(
        ModelConfig(
            vocab_size=31, d_model=32, num_layers=1, num_heads=4, num_kv_heads=4, d_ff=64, max_seq_len=96
        )
    )
    with pytest.raises(KVLibError, match="draft vocabulary 31 != target's 61"):
        generate_speculative(TARGET, other, [1, 2], 3, 2)
    with pytest.raises(KVLibError, match="exceed the models' max_seq_len"):
        generate_speculative(TARGET, SKIP, [1] * 90, 7, 2)
    with pytest.raises(KVLibError, match="outside the vocabulary of 61"):
        generate_speculative(TARGET, SKIP, [1, 61], 3, 2)
    with pytest.raises(KVLibError, match="prompt must be a non-empty"):
        generate_speculative(TARGET, SKIP, [], 3, 2)
    with pytest.raises(KVLibError, match="distinct increasing layer indices in 0 .. 2"):
        layer_draft(TARGET, [2, 0])
