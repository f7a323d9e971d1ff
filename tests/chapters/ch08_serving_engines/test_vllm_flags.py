"""The vLLM map (kvlib.chapters.ch08_serving_engines.vllm_flags, chapter 8): every kvlib place in the table
resolves, so the
table cannot go stale; the resolver finds parameters and fields and names what is missing."""

import pytest

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.vllm_flags import (
    VLLM_FLAG_ROWS,
    bench,
    resolve_place,
    vllm_flag_table,
)

PLACES = sorted({place for row in VLLM_FLAG_ROWS for place in row.kvlib})


@pytest.mark.parametrize("place", PLACES)
def test_every_kvlib_place_resolves(place):
    assert resolve_place(place) is not None


def test_the_issue_s_flags_are_all_mapped():
    flags = {row.flag for row in VLLM_FLAG_ROWS}
    for flag in (
        "--block-size",
        "--gpu-memory-utilization",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--enable-chunked-prefill",
        "--enable-prefix-caching",
        "--kv-cache-dtype",
        "--swap-space",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--speculative-config",
    ):
        assert flag in flags
    assert all(row.kvlib and row.in_vllm and row.in_kvlib for row in VLLM_FLAG_ROWS)
    assert len(vllm_flag_table()) == len(VLLM_FLAG_ROWS)


def test_the_resolver_finds_parameters_and_fields():
    assert resolve_place("kvlib.serving.roofline.kv_budget(memory_fraction)").default == 0.9
    assert resolve_place("kvlib.serving.scheduler.SchedulerConfig.max_num_seqs").default == 256
    assert resolve_place("kvlib.paged.block_manager.BlockManager(enable_prefix_caching)").name == (
        "enable_prefix_caching"
    )


@pytest.mark.parametrize(
    "place, words",
    [
        ("kvlib.serving.roofline.kv_budget(no_such_argument)", "no parameter"),
        ("kvlib.serving.scheduler.SchedulerConfig.no_such_field", "no field"),
        ("kvlib.serving.simulator.no_such_function(block_size)", "no parameter"),
        ("nowhere.at_all(x)", "no module"),
        ("kvlib serving", "module.function"),
        (None, "module.function"),
    ],
)
def test_a_place_that_is_gone_is_named(place, words):
    with pytest.raises(KVLibError, match=words):
        resolve_place(place)


def test_bench_counts_the_places():
    result = bench()
    assert result["vllm_flags_mapped"] == sum(row.flag != "(none)" for row in VLLM_FLAG_ROWS) == 13
    assert result["vllm_places_resolved"] == len(PLACES)
