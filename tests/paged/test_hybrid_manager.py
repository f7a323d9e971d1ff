"""The hybrid block manager: windows free what no later query sees, states stay fixed, the pool balances."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import generate_paged
from kvlib.paged.hybrid_manager import (
    NULL_BLOCK,
    HybridBlockManager,
    KVGroupSpec,
    first_needed_block,
    held_blocks_per_sequence,
)
from kvlib.paged.window_cache import generate_windowed, window_groups

GROUPS = [KVGroupSpec("full", 2), KVGroupSpec("window 8", 2, 8), KVGroupSpec("mamba", 2, state_blocks=3)]


def test_a_window_frees_blocks_wholly_before_its_first_visible_key():
    manager = HybridBlockManager(GROUPS, 100, 4)
    assert manager.allocate(0, 20)
    manager.mark_computed(0)  # next query at 20 sees keys 13..20: blocks 0..2 (tokens 0..11) go
    assert manager.block_table(0, "window 8") == [NULL_BLOCK] * 3 + [
        9,
        10,
    ]  # full took 1..5, the window 6..10
    assert manager.num_held_blocks(0, "window 8") == 2 and manager.num_held_blocks(0, "full") == 5
    assert manager.num_held_blocks(0, "mamba") == 3 and manager.num_window_frees == 3
    assert manager.num_used_blocks == held_blocks_per_sequence(GROUPS, 20, 4) == 10
    with pytest.raises(KVLibError, match="window"):
        manager.slot(0, "window 8", 11)
    assert manager.slot(0, "window 8", 12) // 4 == manager.block_table(0, 1)[3]


def test_first_needed_block_is_vllms_last_useful_token_over_the_block_size():
    assert first_needed_block(20, 8, 4) == 3 and first_needed_block(5, 8, 4) == 0
    assert first_needed_block(8192, 4096, 16) == 256  # 256 blocks of 16 = the window kept


def test_kept_blocks_and_free_return_every_block_to_the_pool():
    manager = HybridBlockManager(GROUPS, 100, 4, free_out_of_window=False)
    manager.allocate(0, 20)
    manager.mark_computed(0)
    assert manager.num_held_blocks(0) == 5 + 5 + 3 and manager.num_window_frees == 0
    assert manager.append_slots(0, 1) and manager.num_held_blocks(0, "full") == 6
    manager.free(0)
    assert manager.num_free_blocks == 100 and 0 not in manager


def test_short_pool_changes_nothing_and_bad_arguments_are_one_line_errors():
    manager = HybridBlockManager(GROUPS, 12, 4)
    assert not manager.allocate(0, 20) and manager.num_free_blocks == 12 and 0 not in manager
    assert manager.allocate(0, 16)  # 4 + 4 + 3 = 11
    assert not manager.append_slots(0, 8) and manager.num_tokens(0) == 16
    for bad in (
        lambda: HybridBlockManager([], 4, 4),
        lambda: HybridBlockManager(GROUPS, 4, 0),
        lambda: HybridBlockManager(GROUPS, 4, 4, free_out_of_window=1),
        lambda: KVGroupSpec("x", 2, 0),
        lambda: KVGroupSpec("x", 2, 4, state_blocks=1),
        lambda: manager.allocate(0, 4),
        lambda: manager.mark_computed(0, 17),
        lambda: manager.block_table(0, "nope"),
        lambda: manager.slot(0, "mamba", 0),
        lambda: manager.num_tokens(7),
    ):
        with pytest.raises(KVLibError):
            bad()


def test_window_groups_need_equal_sizes_and_share_storage_by_rank():
    groups, layer_group, layer_index = window_groups([16, None, 16, None])
    assert [g.name for g in groups] == ["window 16", "full"] and layer_group == [0, 1, 0, 1]
    assert layer_index == [0, 0, 1, 1]
    with pytest.raises(KVLibError, match="as many layers"):
        window_groups([16, None, None])


def test_without_windows_the_cache_decodes_chapter_3s_tokens():
    model = TinyLlama(ModelConfig(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128))
    prompts = [list(range(3, 14)), list(range(30, 37))]
    run = generate_windowed(model, prompts, 10, [None, None], 4, 40)
    assert run.tokens == generate_paged(model, prompts, 10, 4).tokens and run.num_window_frees == 0


def test_freed_blocks_reused_change_no_token_but_freeing_too_early_does():
    model = TinyLlama(ModelConfig(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128, seed=3))
    prompts = [torch.arange(20).tolist(), torch.arange(40, 53).tolist()]
    kept = generate_windowed(model, prompts, 24, [6, None], 2, 80, free_out_of_window=False)
    loose = generate_windowed(model, prompts, 24, [6, None], 2, 80)
    tight = generate_windowed(model, prompts, 24, [6, None], 2, loose.peak_blocks)
    assert tight.tokens == kept.tokens and tight.num_window_frees > 0 and tight.peak_blocks < kept.peak_blocks
    early = generate_windowed(model, prompts, 24, [6, None], 2, loose.peak_blocks, True, [2, None])
    assert early.tokens != kept.tokens
