"""Chapter 10's capacity runs: the shapes' groups, the simulation against the closed forms and the
chapter-2 formula, and the held-blocks trace."""

import math

import pytest

from kvlib.chapters.ch10_window_allocator.bench import bench
from kvlib.chapters.ch10_window_allocator.capacity import capacity_row, held_trace, shape_layout, shape_spec
from kvlib.chapters.ch10_window_allocator.freeing import freeing_runs


def test_layouts_split_the_catalog_shapes_into_equal_groups():
    gemma2, gemma3, jamba = (shape_layout(n, 16) for n in ("Gemma-2-9B", "Gemma-3-like", "Jamba-v0.1"))
    assert [g.kind for g in gemma2.groups] == ["sliding", "full"] and gemma2.groups[0].num_layers == 21
    assert sorted(g.kind for g in gemma3.groups) == ["full"] + ["sliding"] * 5
    assert {g.window for g in gemma3.groups if g.kind == "sliding"} == {1024}
    assert shape_spec("Gemma-3-like").num_layers == 42 and shape_spec("Gemma-3-like").head_dim == 256
    assert [g.kind for g in jamba.groups].count("state") == 7 and jamba.groups[0].num_layers == 4
    # one block of 4 layers x 16 tokens x K, V x 8 heads x 128 x 2 bytes; a state of 4 layers fills 5
    assert jamba.page_bytes == 262_144 and jamba.state_bytes == 1_310_720
    assert {g.state_blocks for g in jamba.groups if g.kind == "state"} == {5}


@pytest.mark.parametrize("name", ["Gemma-2-9B", "Gemma-3-like", "Jamba-v0.1"])
def test_simulated_capacity_matches_the_closed_forms_and_the_size_formula(name):
    row = capacity_row(name, 32 * 2**30, 8192, 16)
    assert row["seqs (kept)"] == row["closed form kept"] and row["seqs (freed)"] == row["closed form freed"]
    assert row["attention bytes held"] == row["formula bytes"]
    assert row["held blocks"] == row["seqs (freed)"] * row["blocks per seq (freed)"]
    if name == "Jamba-v0.1":
        assert row["capacity ratio"] == 1.0  # nothing to free: no window
    else:
        assert row["capacity ratio"] > 1.0


def test_a_pool_smaller_than_one_sequence_holds_none():
    row = capacity_row("Gemma-2-9B", 2**20 * 100, 8192, 16)
    assert row["seqs (kept)"] == row["seqs (freed)"] == 0 and row["closed form freed"] == 0
    assert math.isnan(row["capacity ratio"])


def test_held_trace_stops_growing_in_the_window_groups():
    trace = held_trace("Gemma-3-like", [512, 1024, 2048, 4096], 16)
    assert [r["full"] for r in trace] == [32, 64, 128, 256]
    assert [r["sliding"] for r in trace] == [
        5 * 32,
        5 * 64,
        5 * 64,
        5 * 64,
    ]  # aligned: the window is 64 blocks


def test_freeing_runs_keep_the_tokens_and_the_control_changes_them():
    runs = freeing_runs()
    assert runs["tokens_identical"] and runs["blocks_freed"] > 0
    assert runs["freed_peak_blocks"] < runs["kept_blocks"] and runs["control_tokens_differing"] > 0


@pytest.mark.slow
def test_bench_fields():
    fields = bench()
    assert fields["window_blocks_freed_tokens_identical"] is True and fields["window_capacity_ratio"] > 1
    assert all(v for k, v in fields.items() if "formula_bytes_match" in k)
