"""Chapter 12's experiments: the returning conversation's counts and tokens, the TTFT measurement's
shape, the priced TTFT and swap break-evens worked by hand, and the bench's fields."""

import math

import pytest

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.swap_analysis import A100_LINK_BYTES_PER_S, COPY_CALL_S, break_even
from kvlib.chapters.ch12_offload_tier import pricing, returning
from kvlib.chapters.ch12_offload_tier.bench import bench
from kvlib.serving.roofline import roofline_step_model


@pytest.fixture(scope="module")
def model():
    return returning.cpu_model()


@pytest.fixture(scope="module")
def runs(model):
    return [returning.returning_conversation(model, kind) for kind in returning.STORES]


def test_the_returning_turn_loads_its_whole_history_and_generates_the_same_tokens(runs, model):
    none, cpu, disk = runs
    # the first turn computed 896 + 7 tokens: 56 full blocks; the others evicted all of them
    assert none.allocation.num_cached_tokens == 0 and none.num_saved == 0
    assert cpu.allocation.num_loaded_tokens == returning.HISTORY_LEN and set(cpu.allocation.loaded_from) == {
        "cpu"
    }
    # the small CPU tier keeps the newest saves (the other conversations'): the history comes from disk
    assert disk.allocation.loaded_from == ("disk",) * 56 and disk.num_spilled > 0
    assert returning.returning_tokens_identical(runs, model)


def test_measure_ttft_times_each_store(model):
    timings = returning.measure_ttft(model, ("none", "cpu"), rounds=1)
    assert set(timings) == {"none", "cpu"} and all(t.median_s > 0 for t in timings.values())


def test_an_unknown_store_is_refused(model):
    with pytest.raises(KVLibError, match="store must be one of"):
        returning.make_store("gpu", None)


def test_tier_ttft_by_hand():
    a100 = roofline_step_model("OPT-13B")
    ttft = pricing.tier_ttft("PCIe 4.0 x16")
    # 2,048 tokens at 2 x 12.85e9 FLOPs each at 312 TFLOP/s outlast the weights' read: compute-bound
    assert ttft.recompute_s == pytest.approx(2048 * a100.per_prefill_s)
    # 1,920 tokens x 819,200 bytes at 25 GB/s, plus 2 x 40 gathered calls of 5 µs
    assert ttft.load_s == pytest.approx(1920 * 819_200 / 25e9 + 80 * 5e-6)
    # 128 tokens prefilled: memory-bound, the weights and the 1,920 cached tokens read
    assert ttft.prefill_s == pytest.approx(a100.fixed_s + 1920 * a100.per_context_s)
    assert pricing.tier_ttft("PCIe 5.0 x16").ratio < ttft.ratio < 1
    assert pricing.tier_ttft("PCIe 5.0 x16", from_disk=True).bandwidth == pricing.NVME_READ_BYTES_PER_S
    with pytest.raises(KVLibError, match="link must be one of"):
        pricing.tier_ttft("PCIe 3.0")


def test_the_tie_bandwidth_makes_load_and_saving_equal():
    bandwidth = pricing.tie_bandwidth()
    ttft = pricing.tier_ttft("PCIe 4.0 x16")
    load = pricing.copy_model(bandwidth).transfer_s(pricing.HISTORY_TOKENS)
    assert load == pytest.approx(ttft.recompute_s - ttft.prefill_s)


def test_per_layer_swap_is_chapter_8s_line_and_per_block_loses_at_block_16():
    ours, chapter8 = pricing.swap_break_even(16, per_block=False), break_even()
    assert ours.crossing_tokens == pytest.approx(chapter8.crossing_tokens)
    per_block = pricing.swap_break_even(16, per_block=True)
    assert per_block.cheaper_for_long == "recompute" and per_block.swap_fixed_s == 0
    size = pricing.per_block_break_even_block_size()
    at_size = pricing.swap_break_even(16, True)  # slope: 2 x (bytes / bw + 2 x 40 x call / B)
    expected = 4 * 40 * COPY_CALL_S / (at_size.recompute_per_token_s - 2 * 819_200 / A100_LINK_BYTES_PER_S)
    assert size == pytest.approx(expected) and 16 < size < 64
    assert math.isinf(pricing.per_block_break_even_block_size(bandwidth=1e9))


def test_swap_rows_and_curves_have_their_shape():
    rows = pricing.swap_rows((1, 16, 256))
    assert [r["block_size"] for r in rows] == [1, 16, 256]
    achieved = [r["per block: GB/s achieved"] for r in rows]
    assert achieved == sorted(achieved) and rows[0]["per layer: GB/s achieved"] < 25
    # per block: recomputation wins all but the shortest requests at 1 and 16, swapping everything at 256;
    # per layer: chapter 8's 42.6 tokens, rounded up
    assert [r["per block: cheaper"] for r in rows] == [
        "recompute above 1 token",
        "recompute above 3 tokens",
        "swap at every length",
    ]
    assert {r["per layer: cheaper"] for r in rows} == {"swap above 43 tokens"}
    curves = pricing.ttft_curves((0, 960, 1920))
    assert list(curves)[0] == "recompute" and len(curves) == 5


@pytest.mark.slow
def test_bench_fields():
    result = bench()
    assert result["offload_tokens_identical"] is True and result["offload_loaded_tokens"] == 896
    assert 0 < result["offload_ttft_ratio"] < 1 and result["offload_priced_ttft_ratio_nvme"] > 1


def test_copy_calls_counts_and_times_both_ways(model):
    from kvlib.chapters.ch12_offload_tier.copy_calls import measure_copy_calls

    times = measure_copy_calls(model, 4, rounds=1)
    # 4 blocks x 4 layers x 2 (K, V) calls, against 4 layers x 2
    assert (times.num_per_block_calls, times.num_per_layer_calls) == (32, 8)
    assert times.per_block.median_s > 0 and times.per_layer.median_s > 0
