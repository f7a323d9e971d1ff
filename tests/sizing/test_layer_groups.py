"""Layer stacks as repeated patterns: huge layer counts size at once, the per-layer views still work,
and the reader's layer-pattern rules (kvlib.sizing.layer_groups, kvlib.sizing.layer_pattern)."""

import pytest

from kvlib import KVLibError
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.config_reader import spec_from_config
from kvlib.sizing.layer_groups import FULL_ATTENTION, NO_CACHE, LayerGroups, LayerKind
from kvlib.sizing.spec import ModelSpec, cache_bytes, cache_size

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "max_position_embeddings": 8192,
}
TOKEN = 2 * 8 * 128 * 2  # one token in one Llama-like layer, fp16


@pytest.mark.parametrize("layers", [10**12, 3 * 10**7])
def test_huge_layer_counts_are_sized_without_listing_layers(layers):
    spec = spec_from_config({**LLAMA, "num_hidden_layers": layers})
    assert cache_bytes(spec, 100) == layers * 100 * TOKEN
    assert spec.num_attention_layers == layers and spec.attention_layers[-1] == layers - 1
    assert len(spec.sliding_windows) == layers and spec.sliding_windows[layers // 2] is None
    gemma3 = dict(model_type="gemma3_text", head_dim=128, sliding_window=512, sliding_window_pattern=6)
    gemma = spec_from_config({**LLAMA, **gemma3, "num_hidden_layers": layers})
    globals_ = layers // 6  # layers 5, 11, ...: (i + 1) % 6 == 0
    assert cache_bytes(gemma, 1000) == (globals_ * 1000 + (layers - globals_) * 512) * TOKEN
    assert gemma.sliding_windows[5] is None and gemma.sliding_windows[6] == 512


def test_views_behave_like_the_old_tuples():
    jamba = catalog_entry("Jamba-v0.1").spec
    assert jamba.attention_layers == (4, 12, 20, 28) and list(jamba.attention_layers) == [4, 12, 20, 28]
    assert jamba.attention_layers[1] == 12 and jamba.attention_layers[-1] == 28
    assert jamba.attention_layers[1:3] == (12, 20) and 20 in jamba.attention_layers
    with pytest.raises(IndexError):
        jamba.attention_layers[4]
    assert jamba.sliding_windows == (None,) * 32 and jamba.attention_layers != (4, 12, 20)
    assert hash(jamba) == hash(catalog_entry("Jamba-v0.1").spec)


def test_equal_stacks_compare_equal_however_they_were_built():
    periodic = LayerGroups.periodic([NO_CACHE] * 4 + [FULL_ATTENTION] + [NO_CACHE] * 3, 32)
    listed = LayerGroups.from_kinds([FULL_ATTENTION if i % 8 == 4 else NO_CACHE for i in range(32)])
    assert periodic == listed
    by_hand = ModelSpec("j", 32, 32, 8, 128, attention_layers=(4, 12, 20, 28))
    assert by_hand.layer_groups == periodic


def test_counts_of_a_range():
    groups = LayerGroups.periodic([LayerKind(window=16), FULL_ATTENTION], 10)  # 5 windowed, 5 full
    assert groups.counts() == {LayerKind(window=16): 5, FULL_ATTENTION: 5}
    assert groups.counts(3, 8) == {FULL_ATTENTION: 3, LayerKind(window=16): 2}  # layers 3..7
    assert groups.counts(4, 4) == {}


def test_hand_built_lists_are_bounded_and_checked():
    with pytest.raises(KVLibError, match="up to 1,000,000 layers"):
        ModelSpec("m", 2 * 10**6, 8, 8, 64, attention_layers=(0,))
    with pytest.raises(KVLibError, match="no attention layer"):
        ModelSpec("m", 2, 8, 8, 64, layer_groups=LayerGroups.uniform(NO_CACHE, 2))
    with pytest.raises(KVLibError, match="layer_groups describe 3 layers, not 2"):
        ModelSpec("m", 2, 8, 8, 64, layer_groups=LayerGroups.uniform(FULL_ATTENTION, 3))


def test_all_mamba_layer_types_say_no_attention_layer():
    with pytest.raises(KVLibError, match="has no attention layer: none of its 4 layers keeps a KV cache"):
        spec_from_config({**LLAMA, "num_hidden_layers": 4, "layer_types": ["mamba"] * 4})


def test_granite4_attention_and_chunked_layer_types():
    spec = spec_from_config(
        {**LLAMA, "num_hidden_layers": 4, "attention_chunk_size": 100,
         "layer_types": ["attention", "mamba", "chunked_attention", "linear_attention"]}
    )  # fmt: skip
    assert cache_bytes(spec, 1000) == (1000 + 100) * TOKEN


def test_qwen2_window_from_max_window_layers_on():
    qwen = {**LLAMA, "model_type": "qwen2", "sliding_window": 512, "max_window_layers": 30}
    assert cache_bytes(spec_from_config(qwen), 1000) == 32 * 1000 * TOKEN  # use_sliding_window defaults false
    on = spec_from_config({**qwen, "use_sliding_window": True})
    assert cache_bytes(on, 1000) == (30 * 1000 + 2 * 512) * TOKEN  # layers 30 and 31 slide


def test_two_spellings_must_agree():
    types = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    gemma = {
        **LLAMA,
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "sliding_window": 512,
        "head_dim": 128,
    }
    assert spec_from_config({**gemma, "layer_types": types, "sliding_window_pattern": 6}).num_layers == 12
    with pytest.raises(
        KVLibError, match="contradicts itself: its layer_types and its sliding_window_pattern"
    ):
        spec_from_config({**gemma, "layer_types": types, "sliding_window_pattern": 4})


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hybrid_override_pattern="M*Z" + "M" * 29), "unknown letters \\['Z'\\]"),
        (dict(hybrid_override_pattern="M*"), "string of 32 letters"),
        (dict(attn_layer_indices=[3, 1]), "increasing layer indices below 32"),
        (dict(attn_layer_indices=[40]), "increasing layer indices below 32"),
        (dict(attn_layer_indices="9"), "must be a list of integers"),
        (dict(layer_types=["full_attention"] * 31 + ["hybrid"]), "unknown type 'hybrid'"),
        (dict(layer_types=["sliding_attention"] * 32), "no sliding_window size"),
        (dict(cross_attention_layers=[3]), "no vision_config"),
        (dict(order_of_interleaved_layers="global_attn_first"), "local_attn_first"),
        (dict(no_rope_layers=[1, 0], attention_chunk_size=8), "must list 32 flags"),
        (dict(num_key_value_heads=[8] * 32), "num_key_value_heads.* not \\[8"),
    ],
)
def test_bad_layer_patterns_are_named(change, message):
    with pytest.raises(KVLibError, match=message):
        spec_from_config({**LLAMA, **change})


def test_mpt_window_and_multiquery():
    mpt = {"model_type": "mpt", "n_layers": 4, "n_heads": 8, "d_model": 512, "max_seq_len": 2048}
    windowed = spec_from_config(
        {**mpt, "attn_config": {"sliding_window_size": 100, "attn_type": "multihead_attention"}}
    )
    assert cache_size(windowed, 1000).total_bytes == 4 * 100 * 2 * 8 * 64 * 2
    mqa = spec_from_config({**mpt, "attn_config": {"attn_type": "multiquery_attention"}})
    assert mqa.num_kv_heads == 1
