"""The bench section of chapter 10 (``python -m kvlib bench --only window``): freeing changes no token,
and what it buys a pool on the three shapes."""

from __future__ import annotations

from kvlib.chapters.ch10_window_allocator.capacity import SHAPES, capacity_row
from kvlib.chapters.ch10_window_allocator.freeing import freeing_runs

CAPACITY_POOL_BYTES = 32 * 2**30  # the KV pool of the capacity runs
CAPACITY_CONTEXT = 8192  # tokens per sequence
CAPACITY_BLOCK_SIZE = 16


def bench() -> dict:
    """Numeric fields: the small model's tokens with blocks freed equal those with every block kept;
    the capacity ratio (sequences with freeing over without) of each shape, Gemma-3-like first."""
    runs = freeing_runs()
    rows = {
        name: capacity_row(name, CAPACITY_POOL_BYTES, CAPACITY_CONTEXT, CAPACITY_BLOCK_SIZE)
        for name in SHAPES
    }
    slug = {"Gemma-2-9B": "gemma2", "Gemma-3-like": "gemma3_like", "Jamba-v0.1": "jamba"}
    fields = {
        "window_blocks_freed_tokens_identical": runs["tokens_identical"],
        "window_blocks_freed": runs["blocks_freed"],
        "window_control_tokens_differing": runs["control_tokens_differing"],
        "window_capacity_ratio": rows["Gemma-3-like"]["capacity ratio"],
    }
    for name, row in rows.items():
        fields[f"window_capacity_ratio_{slug[name]}"] = row["capacity ratio"]
        fields[f"window_seqs_freed_{slug[name]}"] = row["seqs (freed)"]
        fields[f"window_formula_bytes_match_{slug[name]}"] = (
            row["attention bytes held"] == row["formula bytes"]
        )
    return fields
