"""Hostile cases at kvlib.sizing's public edges: each a one-line KVLibError naming the argument and
what is allowed, or a right finite answer, in bounded time (a regression corpus; tests/fuzz/ keeps it so).
"""

import json
import math
import time

import pytest

from kvlib import KVLibError
from kvlib.quant.formats import FORMAT_NAMES, kv_quant_format
from kvlib.sizing import widget
from kvlib.sizing.capacity import (
    MAX_GIB,
    capacity_table,
    format_summary,
    max_batch,
    max_context,
    size_summary,
    weight_bytes,
)
from kvlib.sizing.catalog import catalog_config, catalog_entry, model_config
from kvlib.sizing.config_keys import IGNORED_KEYS, check_keys, ignored_keys
from kvlib.sizing.config_reader import spec_from_config
from kvlib.sizing.deployment import Deployment
from kvlib.sizing.dtypes import KVDtype, kv_dtype
from kvlib.sizing.layer_groups import MAX_COUNT, MAX_LISTED_LAYERS
from kvlib.sizing.spec import (
    ModelSpec,
    bytes_per_token,
    cache_bytes,
    cached_tokens,
    kv_cache_bytes,
    token_layer_bytes,
)
from kvlib.sizing.vllm_capacity import vllm_capacity
from kvlib.units import GiB

LLAMA = catalog_entry("Llama-3-8B").spec
GPU, WEIGHTS = 80 * GiB, 16 * GiB
FIXTURES = "tests/sizing/fixtures"


def one_line_error(call, *pattern: str) -> str:
    with pytest.raises(KVLibError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and len(message) <= 300, message
    for part in pattern:
        assert part in message, message
    return message


# ------------------------------------------------------------------ dtypes


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(name="x", bits=-8), "bits must be an integer from 1 to 64, not -8"),
        (dict(name="x", bits=2.5), "bits must be an integer from 1 to 64, not 2.5"),
        (dict(name="x", bits=math.nan), "bits must be an integer"),
        (dict(name="x", bits=True), "bits must be an integer"),
        (dict(name="x", bits=4, group_size=-1, meta_bytes=4), "group_size must be an integer >= 1, not -1"),
        (dict(name="x", bits=4, group_size=32, meta_bytes=-4), "meta_bytes must be an integer >= 0"),
        (dict(name="", bits=4), "name must be a non-empty string"),
        (dict(name=4, bits=4), "name must be a non-empty string"),
    ],
)
def test_a_kv_dtype_with_impossible_numbers_is_refused(kwargs, pattern):
    one_line_error(lambda: KVDtype(**kwargs), pattern)


def test_kv_dtype_of_a_non_name_is_unknown():
    for value in (["fp16"], {"fp16": 1}, None, 16):
        one_line_error(lambda v=value: kv_dtype(v), "unknown KV dtype", "choose from fp32")
    one_line_error(lambda: KV_VECTOR.vector_bytes(-1), "length must be an integer >= 0, not -1")


KV_VECTOR = kv_dtype("int4")


def test_context_bytes_of_a_quant_format_refuses_negative_sizes():
    fmt = kv_quant_format(FORMAT_NAMES[-1])
    one_line_error(lambda: fmt.context_bytes(-5, 128), "num_tokens must be an integer >= 0, not -5")
    one_line_error(lambda: fmt.context_bytes(5, 0), "head_dim must be an integer >= 1, not 0")
    assert fmt.context_bytes(0, 128) == 0


# ------------------------------------------------------------------ specs and sizes


def test_spec_functions_refuse_what_is_not_a_spec():
    for call in (
        lambda: bytes_per_token("Llama-3-8B"),
        lambda: token_layer_bytes("Llama-3-8B"),
        lambda: cached_tokens("Llama-3-8B", 0, 5),
        lambda: max_context("Llama-3-8B", 1, GPU, WEIGHTS),
        lambda: max_batch(None, 10, GPU, WEIGHTS),
        lambda: capacity_table("Llama-3-8B", 8_000_000_000, GPU, 8192),
    ):
        one_line_error(call, "expected a ModelSpec")


def test_cached_tokens_checks_layer_and_context():
    assert cached_tokens(LLAMA, 0, 5) == 5 and cached_tokens(LLAMA, 31, 0) == 0
    one_line_error(lambda: cached_tokens(LLAMA, 0, -5), "context must be an integer >= 0, not -5")
    one_line_error(lambda: cached_tokens(LLAMA, 32, 5), "layer must be an integer from 0 to 31, not 32")
    one_line_error(lambda: cached_tokens(LLAMA, "a", 5), "layer must be an integer")


@pytest.mark.parametrize("key", ["attention_layers", "sliding_windows"])
@pytest.mark.parametrize("value", [3, "0123", 2.0, {1: 2}])
def test_per_layer_lists_that_are_not_lists_are_named(key, value):
    one_line_error(lambda: ModelSpec("m", 4, 4, 4, 8, **{key: value}), f"{key} must be a list")


def test_counts_beyond_kvlibs_bound_are_refused_and_the_bound_itself_is_sized():
    huge = ModelSpec("huge", MAX_COUNT, 1, 1, 1)
    assert cache_bytes(huge, 1) == 2 * MAX_COUNT * 2  # K and V, fp16, one token: no loop over layers
    one_line_error(
        lambda: ModelSpec("m", MAX_COUNT + 1, 1, 1, 1), "num_layers must be at most 1,000,000,000,000"
    )
    one_line_error(lambda: cache_bytes(LLAMA, 10**400, allow_beyond_max=True), "context must be at most")
    one_line_error(lambda: cache_bytes(LLAMA, 10, batch=10**400), "batch must be at most")
    one_line_error(lambda: kv_cache_bytes(1, 1, 1, 10**13), "seq_len must be at most")
    one_line_error(lambda: weight_bytes(10**400), "num_parameters must be at most")
    # the largest sizes still print: every byte count of bounded counts is a finite float in GiB
    summary = size_summary(huge, MAX_COUNT, MAX_COUNT, "fp32")
    assert "GiB" in format_summary(summary)


@pytest.mark.parametrize(
    "limit, pattern",
    [(-5, "limit must be an integer >= 1, not -5"), (0, "limit must be an integer >= 1, not 0"),
     ("8192", "limit must be an integer >= 1, not '8192'"), (2.0, "limit must be an integer")],
)  # fmt: skip
def test_max_context_limit_is_checked(limit, pattern):
    one_line_error(lambda: max_context(LLAMA, 1, GPU, WEIGHTS, limit=limit), pattern)


def test_max_context_limit_is_obeyed():
    assert max_context(LLAMA, 1, GPU, WEIGHTS, limit=100) == 100  # memory holds far more: the limit sets it
    assert max_context(LLAMA, 1, GPU, WEIGHTS) == 8192  # the model's maximum


def test_capacity_table_refuses_a_gpu_without_memory_and_a_string_of_dtypes():
    one_line_error(
        lambda: capacity_table(LLAMA, 8_000_000_000, 0, 8192), "gpu_bytes must be an integer >= 1, not 0"
    )
    one_line_error(
        lambda: capacity_table(LLAMA, 8_000_000_000, GPU, 8192, kv_dtypes="fp16"), "kv_dtypes must be a list"
    )


def test_vllm_capacity_bounds_its_lengths_and_bytes():
    args = dict(spec=LLAMA, gpu_memory_bytes=GPU, weight_bytes=WEIGHTS, peak_activation_bytes=GiB)
    one_line_error(lambda: vllm_capacity(**args, max_model_len=10**400), "max_model_len must be at most")
    one_line_error(lambda: vllm_capacity(**args, block_size=10**30), "block_size must be at most")
    one_line_error(
        lambda: vllm_capacity(**{**args, "gpu_memory_bytes": 10**400}), "gpu_memory_bytes must be at most"
    )


# ------------------------------------------------------------------ the widget


def test_widget_refuses_values_beyond_what_it_can_hold():
    one_line_error(lambda: Deployment("Llama-3-8B", 8192, 1, gpu_gib=1e300), f"at most {MAX_GIB:,} GiB")
    one_line_error(lambda: widget.calculator(context=0), "context must be an integer >= 1, not 0")
    one_line_error(lambda: widget.calculator(model="Llama3"), "unknown model")  # not a traitlets TraitError
    one_line_error(lambda: widget.calculator(batch=1.5), "batch must be an integer")


def test_widget_never_changes_a_value_it_is_given():
    box = widget.calculator(gpu_gib=0.5)
    controls = {c.description: c for c in box.children[:-1]}
    answer = box.children[-1]
    assert controls["GPU GiB"].value == 0.5 and "of 0.5 GiB" in answer.value  # not rounded up to 1
    controls["context"].value = 0
    assert controls["context"].value == 0  # kept as typed, and refused in kvlib's words
    assert "context must be an integer &gt;= 1, not 0" in answer.value
    controls["context"].value = 1000
    assert "max batch" in answer.value


# ------------------------------------------------------------------ configs


def config_with(**changes) -> dict:
    return {**catalog_config("Llama-3-8B"), **changes}


@pytest.mark.parametrize("model_type", [[1], {"a": 1}, ["llama"], 3])
def test_a_model_type_that_is_not_a_string_is_named(model_type):
    one_line_error(
        lambda: spec_from_config(config_with(model_type=model_type)), "model_type must be a string"
    )
    text = {**catalog_config("Llama-3-8B"), "text_config": {"model_type": model_type}}
    one_line_error(lambda: spec_from_config(text), "text_config's model_type must be a string")


@pytest.mark.parametrize(
    "changes",
    [
        dict(sliding_window=1024, sliding_window_pattern=10**12),
        dict(attention_chunk_size=8192, no_rope_layer_interval=10**12),
        dict(model_type="jamba", attn_layer_period=10**12, attn_layer_offset=4),
        dict(full_attention_interval=10**12),
    ],
    ids=["sliding_window_pattern", "no_rope_layer_interval", "attn_layer_period", "full_attention_interval"],
)
def test_a_period_longer_than_the_stack_is_sized_without_listing_it(changes):
    start = time.perf_counter()
    try:
        spec = spec_from_config(config_with(**changes))
    except KVLibError as error:  # full_attention_interval: no full layer in 32, all linear: no KV cache
        assert "no attention layer" in str(error) and "full_attention_interval" in changes
    else:
        counts = spec.layer_groups.counts()
        assert sum(counts.values()) == 32
        if "attn_layer_period" in changes:  # only layer 4 of the first 10**12 attends
            assert spec.num_attention_layers == 1 and spec.attention_layers[0] == 4
        else:  # no global layer among 32: every layer is windowed / chunked
            assert all(kind.window is not None for kind in counts)
    assert time.perf_counter() - start < 1


def test_a_period_as_long_as_a_huge_stack_is_refused_with_the_limit():
    config = config_with(num_hidden_layers=10**12, sliding_window=1024, sliding_window_pattern=10**12)
    one_line_error(
        lambda: spec_from_config(config), "sliding_window_pattern", f"at most {MAX_LISTED_LAYERS:,}"
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("hybrid_override_pattern", "*M" * 1_500_000),
        ("attn_layer_indices", list(range(0, 3_000_000, 2))),
        ("layer_types", ["full_attention", "sliding_attention"] * 1_500_000),
    ],
)
def test_per_layer_patterns_beyond_the_limit_are_refused_at_once(key, value):
    config = config_with(num_hidden_layers=3_000_000, sliding_window=4096, **{key: value})
    start = time.perf_counter()
    one_line_error(lambda: spec_from_config(config), key, f"at most {MAX_LISTED_LAYERS:,} layers")
    assert time.perf_counter() - start < 2


def test_a_million_listed_attention_layers_read_in_bounded_time():
    n = MAX_LISTED_LAYERS
    config = config_with(num_hidden_layers=n, attn_layer_indices=list(range(1, n, 3)))
    start = time.perf_counter()
    spec = spec_from_config(config)
    assert spec.num_attention_layers == len(range(1, n, 3))
    assert time.perf_counter() - start < 5  # was minutes: one LayerGroups concat per index


def test_vision_output_counts_the_image_tokens_it_sizes():
    summary = size_summary(f"{FIXTURES}/meta-llama__Llama-3.2-11B-Vision-Instruct.json", 8192)
    assert summary["cross_attention_tokens"] == 0  # no encoder
    assert summary["image_tokens"] == 6404 and summary["image_cross_attention_layers"] == 8
    assert summary["cross_attention_bytes"] == 6404 * 8 * 2 * 8 * 128 * 2
    text = format_summary(summary)
    assert "(6,404 image tokens in 8 cross-attention layers)" in text and "encoder positions" not in text
    whisper = format_summary(size_summary("Whisper-large-v3", 100))
    assert "(1,500 encoder positions)" in whisper and "image tokens" not in whisper


# ------------------------------------------------------------------ the config-key rule


@pytest.mark.parametrize(
    "key, value", [("offset_alibi", 100), ("use_qkv_bias", True), ("attn_implementation", "eager")]
)
def test_keys_that_cannot_change_the_cache_are_ignored_and_listed(key, value):
    config = config_with(**{key: value})
    assert cache_bytes(spec_from_config(config), 100) == cache_bytes(LLAMA, 100)
    assert key in ignored_keys(config) and key in IGNORED_KEYS


def test_a_key_that_could_change_the_cache_is_still_refused_by_name():
    one_line_error(
        lambda: check_keys({"kv_magic_window": 3}), "'kv_magic_window'", "could change the KV cache"
    )
    long = "window" * 10_000
    message = one_line_error(lambda: check_keys({long: 3}), "60,000 characters")
    assert len(message) < 300


def test_ignored_keys_lists_nested_keys_and_no_key_the_reader_reads():
    config = {
        "num_hidden_layers": 2,
        "vocab_size": 10,
        "text_config": {"rope_theta": 1.0, "head_dim": 4},
        "attn_config": {"clip_qkv": 8},
    }
    assert ignored_keys(config) == ["vocab_size", "text_config.rope_theta", "attn_config.clip_qkv"]


def test_model_config_reads_a_catalog_name_or_a_path(tmp_path):
    assert model_config("Llama-3-8B") == catalog_config("Llama-3-8B")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"a": 1}))
    assert model_config(path) == {"a": 1}
    one_line_error(lambda: model_config(""), "a model must be a catalog name or a path")


def test_a_config_name_with_a_line_break_or_too_long_is_refused():
    for name in ("a\nb", "x" * 201):
        one_line_error(lambda n=name: spec_from_config(config_with(_name_or_path=n)), "_name_or_path must be")
