"""kvlib.sizing: exact byte counts (article table, catalog models by hand), config reading
and its errors, KV quantization overheads, capacity planning, the catalog export."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.sizing.capacity import capacity_table, max_batch, max_context, weight_bytes
from kvlib.sizing.catalog import (
    CATALOG_ORDER,
    catalog_config,
    catalog_entry,
    catalog_export,
    catalog_names,
    resolve_model,
)
from kvlib.sizing.config_reader import spec_from_config
from kvlib.sizing.dtypes import KV_DTYPES
from kvlib.sizing.spec import (
    ModelSpec,
    article_table,
    bytes_per_token,
    cache_bytes,
    cache_size,
    kv_cache_bytes,
    token_layer_bytes,
)
from kvlib.units import GiB

LLAMA_LIKE = dict(
    model_type="llama",
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    hidden_size=4096,
    max_position_embeddings=8192,
)


def spec(name):
    return catalog_entry(name).spec


# ----------------------------------------------------------------------- the article and the issue's numbers


def test_article_table_is_exact():
    rows = {r["num_kv_heads"]: r for r in article_table()}
    assert [rows[h]["bytes"] for h in (32, 8, 4, 1)] == [128 * GiB, 32 * GiB, 16 * GiB, 4 * GiB]
    assert [rows[h]["GB (1024^3 B)"] for h in (32, 8, 4, 1)] == [128.0, 32.0, 16.0, 4.0]
    assert [rows[h]["scheme"] for h in (32, 8, 4, 1)] == ["MHA", "GQA-8", "GQA-4", "MQA"]


def test_catalog_numbers_of_the_issue():
    assert cache_bytes(spec("Llama-2-7B"), 4096) == 2 * GiB
    assert cache_bytes(spec("Llama-3-8B"), 8192) == 1 * GiB
    assert bytes_per_token(spec("OPT-13B")) == 819_200


@pytest.mark.parametrize(
    "name, per_token",
    [
        ("Llama-2-70B", 2 * 80 * 8 * 128 * 2),
        ("Llama-3-70B", 2 * 80 * 8 * 128 * 2),
        ("Mistral-7B-v0.1", 2 * 32 * 8 * 128 * 2),
        ("Falcon-7B", 2 * 32 * 1 * 64 * 2),  # multi_query: one KV head; head_dim 4544 / 71
        ("Qwen2.5-7B", 2 * 28 * 4 * 128 * 2),
        ("Gemma-2-9B", 2 * 42 * 8 * 256 * 2),  # head_dim 256, not 3584 / 16 = 224
        ("DeepSeek-V3", 61 * (512 + 64) * 2),  # one latent per token and layer, no factor 2
        ("Jamba-v0.1", 2 * 4 * 8 * 128 * 2),  # layers 4, 12, 20, 28
        ("Whisper-large-v3", 2 * 32 * 20 * 64 * 2),  # decoder self-attention
    ],
)
def test_bytes_per_token_by_hand(name, per_token):
    assert bytes_per_token(spec(name)) == per_token


def test_caches_at_maximum_context_by_hand():
    assert cache_bytes(spec("Mistral-7B-v0.1"), 32768) == 4096 * 131_072  # every layer capped at 4096 tokens
    assert cache_bytes(spec("Mixtral-8x7B"), 32768) == 4 * GiB  # no window
    gemma = 2 * 8 * 256 * 2
    assert cache_bytes(spec("Gemma-2-9B"), 8192) == 21 * 8192 * gemma + 21 * 4096 * gemma
    assert cache_bytes(spec("Gemma-2-9B"), 4096) == 42 * 4096 * gemma  # below the window: no cap
    size = cache_size(spec("Whisper-large-v3"), 448, batch=2)
    assert size.self_attention_bytes == 2 * 448 * 163_840
    assert size.cross_attention_bytes == 2 * 32 * 1500 * (2 * 20 * 64 * 2)
    assert cache_bytes(spec("Qwen2.5-7B"), 131_072) == 7 * GiB


def test_layers_and_heads_are_two_levers_that_multiply():
    jamba = spec("Jamba-v0.1")
    assert jamba.attention_layers == (4, 12, 20, 28)
    mqa_32_layers = ModelSpec("mqa", 32, 32, 1, 128)
    assert cache_bytes(jamba, 262_144) == cache_bytes(mqa_32_layers, 262_144) == 4 * GiB
    assert cache_bytes(jamba.with_kv_heads(1), 262_144) == GiB // 2


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 96),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from([64, 80, 128, 256]),
    st.integers(1, 100_000),
    st.integers(1, 64),
)
def test_spec_agrees_with_the_plain_formula(layers, kv_heads, head_dim, tokens, batch):
    model = ModelSpec("m", layers, 16, kv_heads, head_dim)
    assert cache_bytes(model, tokens, batch) == kv_cache_bytes(layers, kv_heads, head_dim, tokens, batch, 2)


def test_grows_linearly_until_the_window_then_stops():
    model = ModelSpec("w", 4, 8, 8, 64, sliding_windows=(16, None, 16, None))
    sizes = [cache_bytes(model, t) for t in range(1, 40)]
    per_layer = token_layer_bytes(model)
    assert sizes[15] == 4 * 16 * per_layer  # 16 tokens: no cap yet
    assert sizes[16] - sizes[15] == 2 * per_layer  # past the window only the two global layers grow


# --------------------------------------------------------------------------- KV dtypes


def test_quantized_formats_state_their_scales():
    llama3 = spec("Llama-3-8B")  # 16 vectors of 128 values per token and layer
    assert bytes_per_token(llama3, "fp8") * 2 == bytes_per_token(llama3, "fp16")
    assert token_layer_bytes(llama3, "int8") == 16 * (
        128 + 4 * 4
    )  # 4 groups of 32, fp16 scale + fp16 zero point
    assert token_layer_bytes(llama3, "int4") == 16 * (64 + 4 * 4)
    assert bytes_per_token(llama3, "int4") / bytes_per_token(llama3, "fp16") == 0.3125
    assert KV_DTYPES["int4"].vector_bytes(33) == 17 + 2 * 4  # partial groups pay a full scale
    assert "zero point per 32" in KV_DTYPES["int4"].describe()


def test_unknown_dtype_is_named():
    with pytest.raises(KVLibError, match="unknown KV dtype 'fp4'.*int4"):
        cache_bytes(spec("Llama-3-8B"), 10, dtype="fp4")


# --------------------------------------------------------------------------- config reading


def test_gemma_head_dim_is_taken_from_the_config():
    gemma = catalog_entry("Gemma-2-9B")
    assert gemma.spec.head_dim == 256
    raw = catalog_config("Gemma-2-9B")
    without = {k: v for k, v in raw.items() if k != "head_dim"}
    assert spec_from_config(without).head_dim == 224 != gemma.spec.head_dim
    assert gemma.spec.sliding_windows == (4096, None) * 21


def test_falcon_multi_query_means_one_kv_head():
    falcon = catalog_config("Falcon-7B")
    assert spec_from_config(falcon).num_kv_heads == 1
    # converted configs carry num_kv_heads = 71, which transformers ignores under multi_query
    assert spec_from_config({**falcon, "num_kv_heads": 71}).num_kv_heads == 1
    assert (
        spec_from_config({**falcon, "new_decoder_architecture": True, "num_kv_heads": 71}).num_kv_heads == 71
    )
    with pytest.raises(KVLibError, match="multi_query is true but num_key_value_heads is 8"):
        spec_from_config({**falcon, "num_key_value_heads": 8})


def test_sliding_window_rules():
    mistral = spec_from_config({**LLAMA_LIKE, "model_type": "mistral", "sliding_window": 4096})
    assert mistral.sliding_windows == (4096,) * 32
    qwen_off = spec_from_config(
        {**LLAMA_LIKE, "model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}
    )
    assert qwen_off.sliding_windows == (None,) * 32
    qwen_on = spec_from_config(
        {
            **LLAMA_LIKE,
            "model_type": "qwen2",
            "sliding_window": 512,
            "use_sliding_window": True,
            "max_window_layers": 30,
        }
    )
    assert qwen_on.sliding_windows == (None,) * 30 + (512, 512)
    types = ["sliding_attention"] * 5 + ["full_attention"]
    explicit = spec_from_config(
        {**LLAMA_LIKE, "num_hidden_layers": 6, "sliding_window": 1024, "layer_types": types}
    )
    assert explicit.sliding_windows == (1024,) * 5 + (None,)
    hybrid = spec_from_config(
        {**LLAMA_LIKE, "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    )
    assert hybrid.attention_layers == (3,)


def test_config_file_paths_work(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_LIKE))
    assert resolve_model(str(path)).num_kv_heads == 8
    assert spec_from_config(path).max_context == 8192


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_hidden_layers=None), "no 'num_hidden_layers'"),
        (dict(num_hidden_layers=0), "num_hidden_layers.* >= 1"),
        (dict(num_hidden_layers=True), "num_hidden_layers.* not True"),
        (dict(num_hidden_layers="32"), "num_hidden_layers"),
        (dict(n_layer=30), "contradicts itself: num_hidden_layers=32, n_layer=30"),
        (dict(hidden_size=4100), "no 'head_dim' and hidden_size \\(4100\\) is not divisible"),
        (
            dict(num_key_value_heads=5),
            "num_attention_heads \\(32\\) is not a multiple of its num_key_value_heads \\(5\\)",
        ),
        (dict(layer_types=["full_attention"] * 3), "layer_types must list 32"),
        (dict(layer_types=["full_attention"] * 31 + ["magic"]), "unknown type 'magic'"),
        (dict(layer_types=["sliding_attention"] * 32), "no sliding_window"),
        (dict(attn_layer_period=4, attn_layer_offset=4), "attn_layer_offset \\(4\\) must be smaller"),
        (dict(kv_lora_rank=512), "MLA needs both kv_lora_rank and qk_rope_head_dim"),
        (dict(sliding_window=0), "sliding_window.* >= 1"),
    ],
)
def test_malformed_configs_name_the_key(change, message):
    config = {k: v for k, v in {**LLAMA_LIKE, **change}.items() if v is not None}
    with pytest.raises(KVLibError, match=message):
        spec_from_config(config)


def test_bad_config_files_are_named(tmp_path):
    with pytest.raises(KVLibError, match="no config file"):
        spec_from_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(KVLibError, match="broken.json is not valid JSON"):
        spec_from_config(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(KVLibError, match="must hold a JSON object"):
        spec_from_config(listed)


def test_bad_specs_and_contexts_are_named():
    with pytest.raises(KVLibError, match="multiple of num_kv_heads"):
        ModelSpec("m", 2, 8, 3, 64)
    with pytest.raises(KVLibError, match="attention_layers"):
        ModelSpec("m", 2, 8, 8, 64, attention_layers=(0, 2))
    with pytest.raises(KVLibError, match="sliding_windows has 1 entries for 2 layers"):
        ModelSpec("m", 2, 8, 8, 64, sliding_windows=(4,))
    with pytest.raises(KVLibError, match="context 4,097 exceeds Llama-2-7B's maximum of 4,096"):
        cache_bytes(spec("Llama-2-7B"), 4097)
    with pytest.raises(KVLibError, match="batch must be an integer >= 1"):
        cache_bytes(spec("Llama-2-7B"), 10, batch=0)


# --------------------------------------------------------------------------- catalog


def test_catalog_has_the_issue_models_each_with_a_source():
    names = catalog_names()
    assert names == list(CATALOG_ORDER)
    export = json.loads(json.dumps(catalog_export()))  # plain JSON
    for model in export["models"]:
        assert model["source"].startswith("https://huggingface.co/") and model["source"].endswith(
            "config.json"
        )
        assert model["num_parameters"] > 10**9


def test_unknown_names_suggest_close_matches():
    with pytest.raises(KVLibError, match="did you mean Llama-3-8B"):
        catalog_entry("llama3-8b")
    with pytest.raises(KVLibError, match="choose from Llama-2-7B"):
        catalog_entry("zzzzzz")
    assert catalog_entry("llama-3-8B").name == "Llama-3-8B"


def _export_total(model: dict, dtypes: dict, dtype: str, context: int, batch: int) -> int:
    """The export's formula in plain Python, as a browser calculator would implement it."""
    d = dtypes[dtype]
    n = model["values_per_vector"]
    vector = math.ceil(n * d["bits"] / 8) + (
        math.ceil(n / d["group_size"]) * d["meta_bytes"] if d["group_size"] else 0
    )
    per_layer = model["vectors_per_token_per_layer"] * vector
    tokens = sum(min(context, w) if w else context for w in model["sliding_windows"])
    return batch * per_layer * (tokens + len(model["attention_layers"]) * model["cross_attention_tokens"])


@pytest.mark.parametrize("dtype", ["fp16", "fp8", "int8", "int4"])
def test_export_formula_reproduces_cache_bytes(dtype):
    export = catalog_export()
    for model in export["models"]:
        for context in (1, min(1000, model["max_context"]), model["max_context"]):
            expected = cache_bytes(catalog_entry(model["name"]).spec, context, 3, dtype)
            assert _export_total(model, export["kv_dtypes"], dtype, context, 3) == expected, model["name"]


def test_parameter_counts_match_the_configs():
    """num_parameters in each catalog file is what transformers builds from its config (meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSpeechSeq2Seq

    from kvlib.model.hf import quiet_transformers

    for name in catalog_names():
        config = dict(catalog_config(name))
        model_type = config.pop("model_type")
        config.pop("architectures")
        cls = AutoModelForSpeechSeq2Seq if model_type == "whisper" else AutoModelForCausalLM
        with quiet_transformers(), torch.device("meta"):
            model = cls.from_config(AutoConfig.for_model(model_type, **config))
        assert sum(p.numel() for p in model.parameters()) == catalog_entry(name).num_parameters, name


# --------------------------------------------------------------------------- capacity planning


def test_weight_bytes():
    assert weight_bytes(8_030_261_248, "bf16") == 16_060_522_496
    assert weight_bytes(64, "int4") == 32 + 2 * 4


def test_max_batch_and_max_context_are_tight():
    llama3 = spec("Llama-3-8B")
    gpu, weights, overhead = 80 * GiB, weight_bytes(8_030_261_248), 4 * GiB
    free = gpu - weights - overhead
    for dtype in ("fp16", "int4"):
        batch = max_batch(llama3, 8192, gpu, weights, overhead, dtype)
        assert cache_bytes(llama3, 8192, batch, dtype) <= free < cache_bytes(llama3, 8192, batch + 1, dtype)
    assert max_batch(llama3, 8192, gpu, weights, overhead) == 61
    context = max_context(llama3, 100, gpu, weights, overhead)
    assert cache_bytes(llama3, context, 100) <= free < cache_bytes(llama3, context + 1, 100)


def test_capacity_edge_cases():
    mistral = spec("Mistral-7B-v0.1")  # cache stops growing at the window: any context fits if 4096 does
    assert max_context(mistral, 1, 80 * GiB, 15 * GiB) == 32768
    assert (
        max_batch(spec("Llama-2-70B"), 4096, 80 * GiB, weight_bytes(68_976_648_192)) == 0
    )  # weights alone too big
    assert max_context(spec("Llama-2-70B"), 1, 80 * GiB, weight_bytes(68_976_648_192)) == 0
    with pytest.raises(KVLibError, match="overhead_bytes must be an integer >= 0"):
        max_batch(mistral, 10, 80 * GiB, 0, -1)
    with pytest.raises(KVLibError, match="no maximum context"):
        max_context(ModelSpec("m", 2, 8, 8, 64), 1, GiB, 0)


def test_capacity_table_rows():
    rows = capacity_table(spec("Llama-3-8B"), 8_030_261_248, 80 * GiB, 8192, batch=8, overhead_bytes=4 * GiB)
    assert [r["kv dtype"] for r in rows] == ["fp16", "fp8", "int8", "int4"]
    assert rows[0]["cache (GiB)"] == 8.0 and rows[0]["max batch at 8,192"] == 61
    # at batch 8 every dtype reaches Llama-3's own 8,192 tokens: the model caps it, not memory
    assert [(r["max context at batch 8"], r["max context limited by"]) for r in rows] == [
        (8192, "model's maximum")
    ] * 4
    # at batch 128 an fp16 token costs 128 x 128 KiB = 16 MiB; 80 - 4 GiB - 2 x 8.03e9 B of weights
    # leave 65,543,856,128 B free: 3,906 whole tokens, so memory caps the context
    wide = capacity_table(
        spec("Llama-3-8B"), 8_030_261_248, 80 * GiB, 8192, batch=128, overhead_bytes=4 * GiB
    )
    assert (wide[0]["max context at batch 128"], wide[0]["max context limited by"]) == (3906, "memory")


def test_catalog_config_is_a_copy_of_the_quoted_fields():
    config = catalog_config("falcon-7b")  # names are case-insensitive, as for catalog_entry
    assert config["multi_query"] is True and spec_from_config(config) == spec_from_config(
        catalog_config("Falcon-7B")
    )
    config["n_layer"] = 1
    assert catalog_config("Falcon-7B")["n_layer"] == 32  # the cached catalog is not changed
    with pytest.raises(KVLibError, match="unknown model"):
        catalog_config("Falcon-8B")


def test_max_batch_and_context_on_one_gpu_of_a_tensor_and_pipeline_parallel_layout():
    llama70 = catalog_entry("Llama-3-70B").spec  # 80 layers, 8 KV heads of 128
    free = 80 * GiB - 20 * GiB - 4 * GiB  # one GPU's memory less its weights and overhead: 56 GiB
    # TP 8: one KV head of every layer per GPU, 2 x 80 x 1 x 128 x 2 bytes = 40,960 B per token
    assert max_batch(llama70, 8192, 80 * GiB, 20 * GiB, 4 * GiB, "bf16", 8) == free // (40_960 * 8192) == 179
    # 64 sequences in 6 GiB left on a 30 GiB GPU: 6 GiB / (64 x 40,960 B) = 2,457 tokens
    assert max_context(llama70, 64, 30 * GiB, 20 * GiB, 4 * GiB, "bf16", None, 8) == 6 * GiB // (64 * 40_960)
    # TP 4 x PP 3: 2 KV heads of the largest stage's 27 layers, 2 x 27 x 2 x 128 x 2 bytes per token
    per_token = 2 * 27 * 2 * 128 * 2
    assert max_batch(llama70, 8192, 80 * GiB, 20 * GiB, 4 * GiB, "bf16", 4, 3) == free // (per_token * 8192)
    # one GPU: the whole cache, as before
    assert max_batch(llama70, 8192, 80 * GiB, 20 * GiB, 4 * GiB, "bf16") == free // (8 * 40_960 * 8192)
    with pytest.raises(KVLibError, match="divisible"):
        max_batch(llama70, 8192, 80 * GiB, 20 * GiB, 4 * GiB, "bf16", 3)
