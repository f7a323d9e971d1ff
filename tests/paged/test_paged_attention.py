"""The paged kernel equals contiguous attention, the model generates the same tokens on the paged
cache as on the contiguous one (with each decode kernel), and the chapter 3 measurement helpers
behave (kvlib.kernels.torch_gather, kvlib.paged.paged_cache, kvlib.paged.decode_loop,
kvlib.chapters.ch03_paged_attention.kernel_overhead, kvlib.chapters.ch03_paged_attention.memory_waste)."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.generation import generate
from kvlib.chapters.ch03_paged_attention import kernel_overhead as paged_measure
from kvlib.chapters.ch03_paged_attention.kernel_overhead import (
    KernelSizes,
    paged_vs_contiguous_error,
    random_decode_case,
    time_decode_attention,
)
from kvlib.chapters.ch03_paged_attention.memory_waste import reservation_waste
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import decode_branches, generate_paged
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.paged.usage import block_snapshot, block_usage

# float32: paged and contiguous attention add the same products over different numbers of
# (masked) keys, so they differ by rounding only (observed < 1e-6).
ATOL = 1e-5
SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=96, max_seq_len=256)


def prompts_of(lengths, seed=0, vocab=97):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def contiguous_tokens(model, prompt, num_new):
    return generate(model, torch.tensor([prompt]), num_new, "cache").tokens[0].tolist()


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("num_new", [1, 4])
def test_paged_attention_equals_contiguous(block_size, heads, num_new):
    # lengths chosen so that most last blocks are partial, and one sequence is one token long
    lengths = [1, 17, 70, 33] if num_new == 1 else [4, 17, 70, 33]
    case = random_decode_case(
        lengths, block_size, heads[0], heads[1], head_dim=16, num_new=num_new, seed=block_size
    )
    assert paged_vs_contiguous_error(case) < ATOL


def test_random_case_rejects_more_new_tokens_than_the_shortest_sequence():
    with pytest.raises(KVLibError, match="num_new"):
        random_decode_case([2, 5], 4, num_new=3)


@pytest.mark.parametrize("kernel", ["torch", "numba"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_model_generates_the_same_tokens_on_the_paged_cache(block_size, num_kv_heads, kernel, monkeypatch):
    """With each CPU decode kernel (the gather reference and the fused numba kernel)."""
    if kernel == "numba":
        pytest.importorskip("numba")
    monkeypatch.setattr(PagedKVCache, "decode_kernel", kernel)
    model = TinyLlama(ModelConfig(**{**SMALL, "num_kv_heads": num_kv_heads}))
    prompts = prompts_of([5, 17, 1, 40])  # one batch of different lengths
    run = generate_paged(model, prompts, 15, block_size=block_size)
    assert run.tokens == [contiguous_tokens(model, p, 15) for p in prompts]
    assert block_usage(run.cache.manager).num_sequences == 4


@pytest.mark.parametrize("block_size", [1, 16])
def test_a_group_of_eight_generates_the_same_tokens_through_the_lanes_loops(block_size, monkeypatch):
    """8 query heads per KV head: the numba kernel's heads-in-lanes loops (kvlib.kernels.numba_lanes)."""
    pytest.importorskip("numba")
    monkeypatch.setattr(PagedKVCache, "decode_kernel", "numba")
    model = TinyLlama(ModelConfig(**{**SMALL, "num_heads": 8, "num_kv_heads": 1}))
    prompts = prompts_of([5, 17, 1, 40])
    assert generate_paged(model, prompts, 15, block_size=block_size).tokens == [
        contiguous_tokens(model, p, 15) for p in prompts
    ]


def test_prefix_caching_skips_the_shared_system_prompt_and_keeps_tokens_identical():
    model = TinyLlama(ModelConfig(**SMALL))
    system = prompts_of([40], seed=5)[0]
    prompts = [system + tail for tail in prompts_of([3, 9, 1], seed=6)]
    run = generate_paged(model, prompts, 8, block_size=8)
    assert [a.num_cached_tokens for a in run.allocations] == [0, 40, 40]  # five full blocks
    assert run.tokens == [contiguous_tokens(model, p, 8) for p in prompts]


def test_fork_and_copy_on_write_give_each_branch_its_own_continuation():
    model = TinyLlama(ModelConfig(**SMALL))
    prompt = prompts_of([21])[0]  # block size 8: the last block is partial, so the branches share it
    run = decode_branches(model, prompt, first_tokens=[7, 11, 7], num_new=6, block_size=8)
    prompt_blocks = run.snapshots["prefill"].block_tables[0]
    assert all(run.snapshots["fork"].ref_cnt[b] == 3 for b in prompt_blocks)
    after = run.snapshots["copy-on-write"]
    assert [after.ref_cnt[b] for b in prompt_blocks] == [3, 3, 1]  # two branches copied the last block
    assert run.cache.num_copies == 2
    for branch, first in enumerate([7, 11, 7]):
        assert run.tokens[branch] == contiguous_tokens(model, prompt + [first], 5)
    # the copies hold the prompt's K/V: every branch reads back the same prompt K/V
    for layer in range(model.config.num_layers):
        k0, v0 = run.cache.read(0, layer)
        for branch in (1, 2):
            k, v = run.cache.read(branch, layer)
            assert torch.equal(k[:, :21], k0[:, :21]) and torch.equal(v[:, :21], v0[:, :21])
    with pytest.raises(KVLibError, match="first_tokens must be a non-empty list"):
        decode_branches(model, prompt, [], 3)


def test_cache_protocol_errors_are_named():
    cache = PagedKVCache(ModelConfig(**SMALL), num_blocks=4, block_size=4)
    with pytest.raises(KVLibError, match="no sequences scheduled"):
        cache.prepare(1)
    cache.manager.allocate(0, [1, 2, 3])
    cache.manager.allocate(1, [1, 2])
    with pytest.raises(KVLibError, match="unknown sequence 5"):
        cache.schedule([5])
    with pytest.raises(KVLibError, match="appears twice"):
        cache.schedule([0, 0])
    with pytest.raises(KVLibError, match="at least one sequence"):
        cache.schedule([])
    cache.schedule([0, 1])
    with pytest.raises(KVLibError, match="sequence 0 has 3 tokens without K/V, but the model was given 2"):
        cache.prepare(2)
    with pytest.raises(KVLibError, match="num_new .* must be an integer >= 1, not 0"):
        cache.prepare(0)


def test_generate_paged_reports_a_cache_that_is_too_small():
    model = TinyLlama(ModelConfig(**SMALL))
    with pytest.raises(KVLibError, match="cannot hold prompt 1"):
        generate_paged(model, prompts_of([8, 8]), 4, block_size=4, num_blocks=3)
    with pytest.raises(KVLibError, match=r"full after \d+ decode steps"):
        generate_paged(model, prompts_of([8]), 8, block_size=4, num_blocks=2)
    with pytest.raises(KVLibError, match="num_new"):
        generate_paged(model, prompts_of([8]), 0)


def test_cache_sizes():
    config = ModelConfig(**SMALL)
    cache = PagedKVCache(config, num_blocks=10, block_size=16)
    per_block = 2 * config.num_layers * 16 * config.num_kv_heads * config.head_dim * 4
    assert cache.bytes_per_block == per_block and cache.num_bytes == 10 * per_block


def test_reservation_waste_counts_slots():
    waste = reservation_waste([1, 16, 17, 40], max_len=64, block_size=16)
    assert waste.used_slots == 74 and waste.contiguous_slots == 256
    assert waste.paged_slots == 16 * (1 + 1 + 2 + 3)
    assert waste.internal_fragmentation == 15 + 0 + 15 + 8
    assert waste.expected_fragmentation == 4 * 7.5
    with pytest.raises(KVLibError, match="exceeds max_len"):
        reservation_waste([65], max_len=64)
    with pytest.raises(KVLibError, match="must be positive"):
        reservation_waste([0, 3], max_len=64)


def test_decode_timing_rows_have_all_three_times():
    sizes = KernelSizes(batch=2, num_heads=4, num_kv_heads=2, head_dim=8, lengths=(32,), dtype=torch.float32)
    threads = torch.get_num_threads()
    rows = time_decode_attention(block_sizes=(4, 8), sizes=sizes, device="cpu", rounds=1)
    assert torch.get_num_threads() == threads  # the one-thread timing restores the setting
    assert [(r["length"], r["block_size"]) for r in rows] == [(32, 4), (32, 8)]
    assert all(
        r["kv_bytes"] == 2 * 2 * 2 * 32 * 8 * 4 for r in rows
    )  # K and V, batch, kv heads, tokens, width, fp32
    assert all(r["contiguous_ms"] > 0 and r["gather_ms"] > 0 and r["paged_ms"] > 0 for r in rows)
    # one round: the round's ratios are those of the only (so fastest) samples
    assert all(r["ratio"] == pytest.approx(r["paged_ms"] / r["contiguous_ms"]) for r in rows)
    assert all(
        r["sum_ratio"] == pytest.approx(r["paged_ms"] / (r["gather_ms"] + r["contiguous_ms"])) for r in rows
    )
    assert all(r["gather_ratio"] == pytest.approx(r["gather_ms"] / r["contiguous_ms"]) for r in rows)


def test_timing_case_stores_the_same_kv_contiguously_and_in_blocks():
    sizes = KernelSizes(batch=3, num_heads=4, num_kv_heads=2, head_dim=8, lengths=(32,), dtype=torch.float32)
    q, k_cache, v_cache, tables, seq_lens, k, v = paged_measure.timing_case(
        32, 8, sizes, seed=1, device="cpu"
    )
    assert k_cache.shape == (3 * 4, 8, 2, 8) and k.shape == (3, 32, 2, 8) and tables.shape == (3, 4)
    assert sorted(tables.flatten().tolist()) == list(range(12))  # every block used once, shuffled
    assert tables.flatten().tolist() != list(range(12))
    for seq in range(3):
        for pos in (0, 9, 31):
            block, offset = tables[seq, pos // 8], pos % 8
            assert torch.equal(k[seq, pos], k_cache[block, offset]) and torch.equal(
                v[seq, pos], v_cache[block, offset]
            )
    assert seq_lens.tolist() == [32, 32, 32] and q.shape == (3, 4, 1, 8)
    # the contiguous kernel of the timing computes what the paged kernel computes
    q5 = q.view(3, 2, 2, 1, 8)
    contiguous = paged_measure.attend_gathered(q5, k, v, None).transpose(0, 1).reshape(3, 4, 1, 8)
    paged = paged_measure.paged_attention(q, k_cache, v_cache, tables, seq_lens)
    assert torch.allclose(contiguous, paged, atol=ATOL)
    with pytest.raises(KVLibError, match="not a multiple of block size"):
        paged_measure.timing_case(30, 8, sizes, device="cpu")


def test_kernel_sizes_reach_dram_bytes(monkeypatch):
    monkeypatch.setenv("KVBOOK_LLC_BYTES", "256MiB")
    sizes = paged_measure.kernel_sizes("cpu")
    longest = sizes.lengths[-1]
    assert sizes.lengths == (longest // 16, longest // 4, longest)
    assert longest & (longest - 1) == 0 and longest >= paged_measure.KERNEL_MIN_LONGEST["cpu"]
    target = paged_measure.dram_bytes("cpu")
    assert (
        sizes.kv_bytes(longest) >= target > sizes.kv_bytes(longest // 2)
        or longest == paged_measure.KERNEL_MIN_LONGEST["cpu"]
    )
    if target == 4 * 256 * 2**20:  # not capped by this machine's memory
        assert longest == 131072  # 1 GiB of K+V at 8 KiB per token


def test_tokens_identical_is_true_for_the_paged_cache():
    assert paged_measure.tokens_identical(block_sizes=(1, 16), prompt_lens=(3, 9), num_new=4) is True


def test_chapter_3_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvlib.paged.block_manager import BlockManager
    from kvlib.plotting.paged import draw_block_tables, draw_kernel_overhead, draw_memory_waste

    manager = BlockManager(num_blocks=6, block_size=4)
    manager.allocate(0, list(range(6)))
    manager.mark_computed(0)
    before = block_snapshot(manager)
    manager.fork(0, 1)
    fig = draw_block_tables([("before", before), ("after", block_snapshot(manager))])
    assert len(fig.axes) == 2
    fig2 = draw_memory_waste({"contiguous": (1.0, 3.0), "paged": (1.0, 0.1)})
    rows = [dict(length=n, block_size=bs, ratio=1.5) for n in (8, 16) for bs in (4, 8)]
    fig3 = draw_kernel_overhead(rows)
    assert len(fig3.axes[0].lines) == 3  # one line per length, and the line at 1
    for f in (fig, fig2, fig3):
        plt.close(f)


def test_gather_buffer_is_reused_and_gives_the_same_result():
    from kvlib.kernels.torch_gather import GatherBuffer, paged_attention

    case = random_decode_case([5, 40, 17], 8, 8, 2, head_dim=16, seed=3)
    buffers = (GatherBuffer(), GatherBuffer())
    plain = paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens)
    first = paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, buffers)
    memory = buffers[0]._memory
    second = paged_attention(
        case.q[:1], case.k_cache, case.v_cache, case.block_tables[:1], case.seq_lens[:1], buffers
    )
    assert torch.equal(plain, first) and torch.allclose(second, plain[:1], atol=ATOL)
    assert buffers[0]._memory is memory  # a smaller call reuses the memory
    half = buffers[0].view((4, 2), torch.zeros(1, dtype=torch.float16))
    assert half.dtype == torch.float16 and buffers[0]._memory is not memory  # another dtype gets new memory


def test_paged_attention_rejects_mismatched_shapes():
    from kvlib.kernels.torch_gather import paged_attention

    case = random_decode_case([5, 9], 4, 8, 2, head_dim=16)
    with pytest.raises(KVLibError, match="batch sizes differ"):
        paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables[:1], case.seq_lens[:1])
    with pytest.raises(KVLibError, match="KV heads"):
        paged_attention(case.q[:, :3], case.k_cache, case.v_cache, case.block_tables, case.seq_lens)
    with pytest.raises(KVLibError, match="KV heads"):
        paged_attention(case.q[..., :8], case.k_cache, case.v_cache, case.block_tables, case.seq_lens)


def test_key_mask_is_needed_only_for_several_queries_or_different_lengths():
    from kvlib.kernels.torch_gather import GatherBuffer, key_mask, paged_attention

    same = key_mask(torch.tensor([7, 7, 7]), num_new=1)
    assert same.num_keys == 7 and same.bias is None  # single-token steps over one length: nothing to hide
    mixed = key_mask(torch.tensor([3, 5]), num_new=2)
    hidden = torch.isinf(mixed.bias)
    # query 0 of the 3-token sequence sits at position 1: it sees keys 0-1; query 1 keys 0-2;
    # keys 3-4 are padding
    assert hidden[0].tolist() == [[False, False, True, True, True], [False, False, False, True, True]]
    assert hidden[1].tolist() == [[False, False, False, False, True], [False, False, False, False, False]]
    assert key_mask(torch.tensor([3, 5]), 2, lengths=[3, 5]).num_keys == 5
    case = random_decode_case([5, 40, 17], 8, 8, 2, head_dim=16, num_new=3, seed=4)
    given = key_mask(case.seq_lens, 3)
    buffers = (GatherBuffer(), GatherBuffer(), GatherBuffer())  # a third buffer holds the scores
    plain = paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens)
    reused = paged_attention(
        case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, buffers, given
    )
    assert torch.equal(plain, reused)


@pytest.mark.parametrize("heads", [(8, 2), (8, 1)], ids=["GQA", "MQA"])
def test_a_long_prefill_in_chunks_of_queries_equals_contiguous_attention(heads):
    from kvlib.kernels.torch_gather import QUERY_CHUNK

    num_new = 2 * QUERY_CHUNK + 37  # three chunks, the last one partial
    case = random_decode_case(
        [num_new, num_new + 90], 16, heads[0], heads[1], head_dim=16, num_new=num_new, seed=7
    )
    assert paged_vs_contiguous_error(case) < ATOL
    model = TinyLlama(ModelConfig(**{**SMALL, "num_kv_heads": heads[1]}))
    prompts = prompts_of([num_new - 100, 30])  # the first prompt is prefilled in two chunks
    assert generate_paged(model, prompts, 6, block_size=16).tokens == [
        contiguous_tokens(model, p, 6) for p in prompts
    ]
