"""Per-GPU caches under tensor and pipeline parallelism, as vLLM lays them out (kvlib.sizing.parallel)."""

import pytest

from kvlib import KVLibError
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.config_reader import spec_from_config
from kvlib.sizing.layer_groups import NO_CACHE, LayerGroups, LayerKind
from kvlib.sizing.parallel import (
    check_parallel,
    kv_heads_per_gpu,
    per_gpu_bytes,
    pp_layer_ranges,
    stage_bytes,
)
from kvlib.sizing.spec import ModelSpec


def spec(name):
    return catalog_entry(name).spec


def test_pp_layer_ranges_follow_vllms_get_pp_indices():
    assert pp_layer_ranges(32, 4) == [(0, 8), (8, 16), (16, 24), (24, 32)]
    # 61 layers on 4 stages: 15 each, the remainder 1 to the second-to-last stage
    assert pp_layer_ranges(61, 4) == [(0, 15), (15, 30), (30, 46), (46, 61)]
    # 22 on 4: 5 each, remainder 2 to the 2nd-to-last and 3rd-to-last: 5, 6, 6, 5
    assert pp_layer_ranges(22, 4) == [(0, 5), (5, 11), (11, 17), (17, 22)]
    assert pp_layer_ranges(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert pp_layer_ranges(3, 2) == [(0, 2), (2, 3)]
    assert pp_layer_ranges(7, 1) == [(0, 7)]


def test_kv_heads_split_then_replicate():
    llama70 = spec("Llama-3-70B")  # 64 query heads, 8 KV heads
    assert [kv_heads_per_gpu(llama70, tp) for tp in (1, 2, 4, 8, 16, 32, 64)] == [8, 4, 2, 1, 1, 1, 1]
    assert kv_heads_per_gpu(spec("DeepSeek-V3"), 8) == 1  # MLA: the latent on every rank


def test_per_gpu_bytes_by_hand():
    llama70 = spec("Llama-3-70B")  # 80 layers, 8 KV heads x 128
    token = 2 * 128 * 2  # K and V of one head, fp16
    assert per_gpu_bytes(llama70, 8192) == 80 * 8192 * 8 * token
    assert per_gpu_bytes(llama70, 8192, tensor_parallel_size=4) == 80 * 8192 * 2 * token
    # TP 16 > 8 KV heads: each rank holds one (replicated) head
    assert per_gpu_bytes(llama70, 8192, tensor_parallel_size=16) == 80 * 8192 * 1 * token
    # PP 3: 80 = 26 + 27 + 27; the largest stage has 27 layers
    assert per_gpu_bytes(llama70, 8192, tensor_parallel_size=8, pipeline_parallel_size=3) == 27 * 8192 * token
    deepseek = spec("DeepSeek-V3")  # 61 MLA layers, latent 512 + 64, replicated on every TP rank
    assert per_gpu_bytes(deepseek, 1000, tensor_parallel_size=8) == 61 * 1000 * 576 * 2
    # PP 2 on 61 layers: 31 + 30
    assert per_gpu_bytes(deepseek, 1000, pipeline_parallel_size=2) == 31 * 1000 * 576 * 2


def test_the_largest_stage_depends_on_where_the_attention_layers_are():
    jamba = spec("Jamba-v0.1")  # attention in layers 4, 12, 20, 28 of 32
    token = 2 * 8 * 128 * 2
    # PP 8: stages of 4 layers; stages 1, 3, 5, 7 each hold one attention layer, the others none
    assert stage_bytes(jamba, 100, pipeline_parallel_size=8) == [0, 100 * token] * 4
    # PP 3 (10, 11, 11 layers: 0-9, 10-20, 21-31): layers {4}, {12, 20}, {28}
    assert stage_bytes(jamba, 100, pipeline_parallel_size=3) == [100 * token, 200 * token, 100 * token]
    gemma = spec("Gemma-2-9B")  # 42 layers, even ones slide over 4096
    # PP 2: 21 + 21 layers; stage 0 has 11 sliding + 10 global, stage 1 10 sliding + 11 global
    gemma_token = 2 * 8 * 256 * 2
    assert per_gpu_bytes(gemma, 8192, pipeline_parallel_size=2) == (10 * 4096 + 11 * 8192) * gemma_token


def test_whisper_cross_attention_splits_with_the_layers():
    whisper = spec("Whisper-large-v3")  # 32 decoder layers, 20 heads x 64, 1500 encoder positions
    assert per_gpu_bytes(whisper, 448, tensor_parallel_size=4, pipeline_parallel_size=2) == (
        16 * (448 + 1500) * 2 * 5 * 64 * 2
    )


def test_per_layer_heads_split_per_layer():
    openelm = spec_from_config(
        {
            "model_type": "openelm",
            "num_transformer_layers": 3,
            "num_query_heads": [8, 12, 16],
            "num_kv_heads": [2, 3, 4],
            "head_dim": 64,
            "model_dim": 512,
        }
    )
    with pytest.raises(
        KVLibError, match="KV heads \\(3\\) must divide or be divisible by tensor parallel size \\(2\\)"
    ):
        per_gpu_bytes(openelm, 10, tensor_parallel_size=2)
    wider = spec_from_config(
        {
            "model_type": "openelm",
            "num_transformer_layers": 3,
            "num_query_heads": [8, 16, 32],
            "num_kv_heads": [2, 4, 8],
            "head_dim": 64,
            "model_dim": 512,
        }
    )
    # TP 4: 2 heads -> 1 (replicated), 4 -> 1, 8 -> 2 per rank
    assert per_gpu_bytes(wider, 10, tensor_parallel_size=4) == (1 + 1 + 2) * 10 * 2 * 64 * 2


@pytest.mark.parametrize(
    "tp, pp, message",
    [
        (3, 1, "total number of attention heads \\(64\\) must be divisible by tensor parallel size \\(3\\)"),
        (1, 81, "pipeline_parallel_size \\(81\\) exceeds the 80 layers"),
        (0, 1, "tensor_parallel_size must be an integer >= 1"),
        (1, True, "pipeline_parallel_size must be an integer >= 1"),
    ],
)
def test_vllms_refusals(tp, pp, message):
    with pytest.raises(KVLibError, match=message):
        check_parallel(spec("Llama-3-70B"), tp, pp)


def test_kv_heads_that_neither_divide_nor_are_divided_are_refused():
    odd = ModelSpec("odd", 4, 12, 6, 64)
    check_parallel(odd, 3)  # 6 KV heads over 3 ranks: 2 each
    check_parallel(odd, 12)  # 12 ranks over 6 heads: each head on two ranks
    with pytest.raises(
        KVLibError, match="KV heads \\(6\\) must divide or be divisible by tensor parallel size \\(4\\)"
    ):
        check_parallel(odd, 4)


def test_huge_stacks_split_without_listing_layers():
    groups = LayerGroups.periodic([LayerKind(window=512)] * 5 + [LayerKind()], 10**12)
    gemma_like = ModelSpec("huge", 10**12, 8, 4, 256, layer_groups=groups)
    stages = stage_bytes(gemma_like, 1000, pipeline_parallel_size=4)
    # 10**12 / 4 layers per stage; 10**12 / 4 = 250,000,000,000 = 6 x 41,666,666,666 + 4:
    # stage 0 holds 41,666,666,666 global layers (i % 6 == 5); each layer keeps 512 or 1000 tokens
    per_token = 2 * 4 * 256 * 2
    global_0 = 41_666_666_666
    assert stages[0] == (global_0 * 1000 + (250_000_000_000 - global_0) * 512) * per_token
    mamba = ModelSpec("m", 8, 8, 8, 8, layer_groups=LayerGroups.periodic([NO_CACHE, LayerKind()], 8))
    assert stage_bytes(mamba, 1, pipeline_parallel_size=8) == [0, 256] * 4
