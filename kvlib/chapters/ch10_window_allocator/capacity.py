"""How many sequences a fixed pool holds with and without window freeing, on published shapes (chapter 10).

The shapes come from the catalog (:mod:`kvlib.sizing.catalog`): Gemma-2-9B as published (one layer
in two slides over 4,096 tokens), a Gemma-3-like stack (Gemma-2-9B's dimensions with Gemma-3's
layout: five local layers to one global, window 1,024; the Gemma-3 config reader's default pattern),
and Jamba-v0.1 (one attention layer in eight; the other layers keep a Mamba state, sized as in
chapter 5). :func:`shape_layout` splits each into vLLM-style groups of equal size over one pool;
:func:`simulate_capacity` admits sequences of one length into a :class:`HybridBlockManager` until
the pool is full, and :func:`capacity_row` checks the result against the closed forms and against
:func:`kvlib.sizing.spec.cache_bytes`, the chapter-2 formula that caps each window layer at its window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlib.chapters.ch05_levers.levers import mamba_state_bytes
from kvlib.paged.block_manager import num_blocks_for
from kvlib.paged.hybrid_manager import HybridBlockManager, KVGroupSpec, held_blocks_per_sequence
from kvlib.sizing.catalog import catalog_config, catalog_entry
from kvlib.sizing.config_reader import spec_from_config
from kvlib.sizing.spec import ModelSpec, cache_bytes, kind_token_bytes

GEMMA3_WINDOW = 1024  # Gemma 3 technical report: local layers slide over 1,024 tokens
SHAPES = ("Gemma-2-9B", "Gemma-3-like", "Jamba-v0.1")


def shape_spec(name: str) -> ModelSpec:
    """One of :data:`SHAPES` as a ModelSpec: a catalog model, or Gemma-2-9B's config read as Gemma-3's."""
    if name == "Gemma-3-like":
        config = catalog_config("Gemma-2-9B") | {"model_type": "gemma3_text", "sliding_window": GEMMA3_WINDOW}
        return spec_from_config(config, name="Gemma-3-like", max_context=config["max_position_embeddings"])
    return catalog_entry(name).spec


@dataclass(frozen=True)
class ShapeLayout:
    """A model's layers as equal-size groups over one pool, and the bytes of one block."""

    name: str
    spec: ModelSpec
    groups: tuple[KVGroupSpec, ...]
    page_bytes: int  # one block: block_size tokens of one layer per group member (fp16)
    state_bytes: int  # one sequence's state in one state group (0 without Mamba layers)


def shape_layout(name: str, block_size: int) -> ShapeLayout:
    """Split :func:`shape_spec`'s layers by kind into groups of the same number of layers (here the greatest
    common divisor of the kinds' counts; vLLM's hybrid allocator also gives its groups equal sizes, so that
    all share one page size, though its rule for choosing the size may differ).
    A Mamba group's state (``mamba_state_bytes`` of its layers) takes the blocks it fills."""
    spec = shape_spec(name)
    counts = spec.layer_groups.counts()
    size = math.gcd(*counts.values())
    attention = [kind for kind in counts if kind.caches]
    page = size * block_size * kind_token_bytes(spec, attention[0])
    state = 0
    if any(not kind.caches for kind in counts):
        config = catalog_config(name)
        state = mamba_state_bytes(
            config["hidden_size"],
            size,
            config["mamba_d_state"],
            config["mamba_d_conv"],
            config["mamba_expand"],
        )
    groups = []
    for kind, count in counts.items():
        for i in range(count // size):
            if not kind.caches:
                groups.append(KVGroupSpec(f"mamba {i}", size, state_blocks=math.ceil(state / page)))
            else:
                label = "full" if kind.window is None else f"window {kind.window}"
                groups.append(KVGroupSpec(f"{label} {i}", size, kind.window))
    return ShapeLayout(name, spec, tuple(groups), page, state)


def simulate_capacity(
    layout: ShapeLayout, num_blocks: int, context: int, block_size: int, free: bool
) -> dict:
    """Admit sequences of ``context`` tokens (allocate, compute, let windows free) until one does not fit."""
    manager = HybridBlockManager(layout.groups, num_blocks, block_size, free_out_of_window=free)
    num_seqs = 0
    while manager.allocate(num_seqs, context):
        manager.mark_computed(num_seqs)
        num_seqs += 1
    return {"num_seqs": num_seqs, "used_blocks": manager.num_used_blocks, "frees": manager.num_window_frees}


def capacity_row(name: str, pool_bytes: int, context: int, block_size: int) -> dict:
    """One shape's capacity with and without freeing, simulated, with the closed forms beside."""
    layout = shape_layout(name, block_size)
    num_blocks = pool_bytes // layout.page_bytes
    kept = simulate_capacity(layout, num_blocks, context, block_size, free=False)
    freed = simulate_capacity(layout, num_blocks, context, block_size, free=True)
    full_blocks = sum(
        g.state_blocks or num_blocks_for(context, block_size) for g in layout.groups
    )  # a new sequence before its windows free anything
    held = held_blocks_per_sequence(layout.groups, context, block_size)
    state_blocks = sum(g.state_blocks for g in layout.groups)
    return {
        "shape": name,
        "groups": len(layout.groups),
        "layers per group": layout.groups[0].num_layers,
        "page bytes": layout.page_bytes,
        "pool blocks": num_blocks,
        "blocks per seq (kept)": full_blocks,
        "blocks per seq (freed)": held,
        "seqs (kept)": kept["num_seqs"],
        "seqs (freed)": freed["num_seqs"],
        "capacity ratio": freed["num_seqs"] / kept["num_seqs"] if kept["num_seqs"] else math.nan,
        "closed form kept": num_blocks // full_blocks,
        "closed form freed": (num_blocks - full_blocks) // held + 1 if num_blocks >= full_blocks else 0,
        "held blocks": freed["used_blocks"],
        "attention bytes held": (freed["used_blocks"] - freed["num_seqs"] * state_blocks) * layout.page_bytes,
        "formula bytes": cache_bytes(layout.spec, context, freed["num_seqs"]) if freed["num_seqs"] else 0,
        "state blocks per seq": state_blocks,
    }


def capacity_sweep(name: str, pool_bytes: int, contexts, block_size: int) -> list[dict]:
    """:func:`capacity_row`'s sequences, kept and freed, at each context (the figure's curves)."""
    rows = []
    for context in contexts:
        row = capacity_row(name, pool_bytes, context, block_size)
        rows.append(
            {"shape": name, "context": context, "kept": row["seqs (kept)"], "freed": row["seqs (freed)"]}
        )
    return rows


def held_trace(name: str, lengths, block_size: int) -> list[dict]:
    """Blocks one sequence of shape ``name`` holds per group kind as it grows to each of ``lengths``
    (a :class:`HybridBlockManager` with freeing, its pool as large as the sequence needs kept)."""
    layout = shape_layout(name, block_size)
    longest = max(lengths)
    needed = sum(g.state_blocks or num_blocks_for(longest, block_size) for g in layout.groups)
    manager = HybridBlockManager(layout.groups, needed, block_size)
    manager.allocate(0, lengths[0])
    rows = []
    for length in lengths:
        if length > manager.num_tokens(0):
            manager.append_slots(0, length - manager.num_tokens(0))
        manager.mark_computed(0)
        row = {"length": length}
        for i, group in enumerate(layout.groups):
            row[group.kind] = row.get(group.kind, 0) + manager.num_held_blocks(0, i)
        rows.append(row)
    return rows
