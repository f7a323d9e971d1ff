"""The reader's key lists: every key it knows, every key it ignores, and the refusal of the rest."""

import json
from pathlib import Path

import pytest

from kvlib import KVLibError
from kvlib.sizing.config_keys import IGNORED_KEYS, KNOWN_KEYS, SIZE_RELEVANT
from kvlib.sizing.config_reader import spec_from_config

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "max_position_embeddings": 8192,
}


def test_the_known_keys_are_these():
    assert KNOWN_KEYS == {
        "num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_transformer_layers",
        "num_attention_heads", "n_head", "n_heads", "num_heads", "num_query_heads",
        "hidden_size", "n_embd", "d_model", "model_dim",
        "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query", "new_decoder_architecture",
        "multi_query_attention", "multi_query_group_num", "kv_channels", "attn_config", "kv_n_heads",
        "head_dim", "attention_head_dim", "d_kv",
        "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
        "max_context_length", "max_sequence_length", "max_target_positions", "max_source_positions",
        "layer_types", "sliding_window", "use_sliding_window", "max_window_layers",
        "sliding_window_pattern", "attention_chunk_size", "no_rope_layers", "no_rope_layer_interval",
        "attn_layer_indices", "hybrid_override_pattern", "attn_layer_period", "attn_layer_offset",
        "full_attention_interval", "cross_attention_layers", "sliding_window_size", "attn_type",
        "order_of_interleaved_layers", "layers_block_type", "_sliding_window_pattern",
        "kv_lora_rank", "qk_rope_head_dim",
        "is_encoder_decoder", "encoder_layers", "decoder_layers", "num_decoder_layers",
        "decoder_attention_heads", "text_config", "vision_config",
        "image_size", "patch_size", "max_num_tiles",
        "model_type", "_name_or_path", "pre_seq_len",
    }  # fmt: skip


def test_the_ignored_keys_are_listed_and_disjoint_from_the_known_ones():
    assert not KNOWN_KEYS & IGNORED_KEYS
    # a sample of each reason; the whole list is in kvlib/sizing/config_keys.py with its reasons
    for key in (
        "intermediate_size", "rope_scaling", "rope_theta", "attention_dropout", "mamba_d_state",
        "num_local_experts", "q_lora_rank", "num_nextn_predict_layers", "original_max_position_embeddings",
        "linear_num_key_heads", "attn_logit_softcapping", "expert_layer_period",
    ):  # fmt: skip
        assert key in IGNORED_KEYS, key
    assert len(IGNORED_KEYS) > 150


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_every_size_relevant_key_of_the_hub_fixtures_is_known_or_ignored(path):
    config = json.loads(path.read_text())
    for part in (config, config.get("text_config") or {}, config.get("attn_config") or {}):
        for key in part:
            assert key in KNOWN_KEYS or key in IGNORED_KEYS or not SIZE_RELEVANT.search(key), key


@pytest.mark.parametrize(
    "key, value",
    [
        ("sliding_window_pattern_v2", 6),
        ("global_attn_every_n_layers", 3),
        ("layers_block_types", ["mamba", "attention"]),
        ("attn_type_list", [0, 1]),  # MiniMax: lightning vs softmax attention
        ("block_types", ["recurrent", "attention"]),  # RecurrentGemma
        ("num_kv_shared_layers", 12),  # Gemma-3n: layers that reuse another layer's cache
        ("kv_lora_rank_v2", 512),
        ("audio_config", {}),
        ("head_size", 64),  # RWKV's misnamed heads
    ],
)
def test_an_unknown_size_relevant_key_is_refused_by_name(key, value):
    with pytest.raises(KVLibError, match=f"the key '{key}'"):
        spec_from_config({**LLAMA, key: value})


def test_the_refusal_reaches_into_text_config_and_attn_config():
    with pytest.raises(KVLibError, match="text_config has the key 'sliding_window_pattern_v2'"):
        spec_from_config({"model_type": "x", "text_config": {**LLAMA, "sliding_window_pattern_v2": 2}})
    with pytest.raises(KVLibError, match="attn_config has the key 'kv_groups'"):
        spec_from_config({**LLAMA, "attn_config": {"kv_groups": 2}})


def test_harmless_keys_pass():
    assert spec_from_config({**LLAMA, "vocab_size": 1, "torch_dtype": "bfloat16", "foo": 1}).num_kv_heads == 8


def test_state_space_models_have_no_attention_layer():
    with pytest.raises(KVLibError, match="'mamba' has no attention layer"):
        spec_from_config({"model_type": "mamba", "num_hidden_layers": 24, "hidden_size": 768})


def test_zambas_hybrid_blocks_are_refused():
    with pytest.raises(KVLibError, match="layers_block_type has an unknown type 'hybrid'"):
        spec_from_config({**LLAMA, "num_hidden_layers": 2, "layers_block_type": ["mamba", "hybrid"]})


@pytest.mark.parametrize(
    "model_type, num_attention_layers",
    [("llama", 32), ("mistral", 32), ("gemma3_text", 26), ("deepseek_v3", 61), ("jamba", 4),
     ("qwen3_next", 12), ("gpt_oss", 36), ("falcon", 32), ("gpt2", 12), ("mllama", 40)],
)  # fmt: skip
def test_transformers_own_config_dicts_are_read(model_type, num_attention_layers):
    """transformers' to_dict() (what kvlib.chapters.ch02_cache_size.size_check passes) carries every key the
    class has.
    """
    transformers = pytest.importorskip("transformers")
    config = transformers.CONFIG_MAPPING[model_type]().to_dict()
    assert spec_from_config(config).num_attention_layers == num_attention_layers
