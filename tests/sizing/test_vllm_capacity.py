"""vLLM's KV blocks, cache tokens and maximum concurrency (kvlib.sizing.vllm_capacity) and the
``capacity`` command (kvlib.cli.capacity), each number worked out by hand here from the
rules of vLLM's kv_cache_utils.py / kv_cache_interface.py / gpu_worker.py."""

from __future__ import annotations

import argparse
import inspect
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.cli import _Parser
from kvlib.cli import capacity as capacity_command
from kvlib.sizing import vllm_capacity
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import ModelSpec
from kvlib.sizing.vllm_capacity import VLLM_FLAGS, vllm_log_lines
from kvlib.units import GiB

LLAMA3 = catalog_entry("Llama-3-8B").spec  # 32 layers, 8 KV heads x 128, max 8,192 tokens
LLAMA3_WEIGHTS = 16_060_522_496  # 8,030,261,248 parameters x 2 bytes (bf16)


def capacity(spec=LLAMA3, gpu=80 * GiB, weights=LLAMA3_WEIGHTS, activations=2 * GiB, **kw):
    return vllm_capacity.vllm_capacity(spec, gpu, weights, activations, **kw)


def test_uniform_model_as_vllm_logs_it():
    c = capacity(non_torch_bytes=GiB // 2)
    # requested = 80 GiB x 0.9 = 77,309,411,328; not KV = weights + 2 GiB + 0.5 GiB
    assert c.requested_bytes == 77_309_411_328
    assert c.non_kv_cache_bytes == 16_060_522_496 + 2_147_483_648 + 536_870_912 == 18_744_877_056
    assert c.available_bytes == 77_309_411_328 - 18_744_877_056 == 58_564_534_272
    # one page: 16 tokens x 8 heads x (K + V) x 128 values x 2 bytes = 65,536 B; 32 layers share a block
    assert c.block_bytes == 32 * 16 * 8 * 2 * 128 * 2 == 2_097_152
    assert c.num_blocks == 58_564_534_272 // 2_097_152 == 27_925
    assert c.num_kv_cache_groups == 1 and c.num_layers_per_group == 32
    assert c.num_tokens == 27_925 * 16 == 446_800
    assert c.blocks_per_request == 8192 // 16 == 512
    assert c.max_concurrency == 27_925 / 512
    assert vllm_log_lines(c) == [
        "Available KV cache memory: 54.54 GiB",  # 58,564,534,272 / 2**30 = 54.5429...
        "GPU KV cache size: 446,800 tokens",
        "Maximum concurrency for 8,192 tokens per request: 54.54x",  # 27,925 / 512 = 54.541...
    ]


def test_max_model_len_and_a_partial_last_block():
    c = capacity(max_model_len=1000, block_size=32)
    # blocks of 32 tokens: 2 x 4,194,304 B pages; a 1,000-token request takes cdiv(1000, 32) = 32 blocks
    available = 77_309_411_328 - 16_060_522_496 - 2_147_483_648
    assert c.num_blocks == available // (32 * 32 * 8 * 2 * 128 * 2)
    assert c.blocks_per_request == 32 and c.num_tokens == c.num_blocks * 32
    assert not c.exceeds_max_context
    assert capacity(max_model_len=10_000).exceeds_max_context  # computed, flagged, not refused


def test_fp8_cache_and_float32_auto():
    fp8 = capacity(kv_cache_dtype="fp8")
    assert fp8.bytes_per_value == 1 and fp8.block_bytes == 32 * 16 * 8 * 2 * 128 * 1
    assert capacity(kv_cache_dtype="auto", model_dtype="float32").block_bytes == 32 * 16 * 8 * 2 * 128 * 4
    with pytest.raises(KVLibError, match="vLLM has no --kv-cache-dtype 'int4'"):
        capacity(kv_cache_dtype="int4")
    with pytest.raises(KVLibError, match="unknown --dtype 'fp7'"):
        capacity(model_dtype="fp7")


def test_tensor_parallel_beyond_the_kv_heads_keeps_one_head_per_rank():
    c = capacity(tensor_parallel_size=16, weights=LLAMA3_WEIGHTS // 16)
    # 8 KV heads on 16 ranks: each rank caches 1 (replicated), not 8 / 16
    assert c.kv_heads_per_gpu == 1
    assert c.block_bytes == 32 * 16 * 1 * 2 * 128 * 2 == 262_144
    assert c.num_blocks == (77_309_411_328 - 16_060_522_496 // 16 - 2 * GiB) // 262_144
    c4 = capacity(tensor_parallel_size=4)
    assert c4.kv_heads_per_gpu == 2 and c4.block_bytes == 32 * 16 * 2 * 2 * 128 * 2


def test_mla_latent_is_replicated_on_every_rank():
    spec = catalog_entry("DeepSeek-V3").spec  # 61 layers, latent 512 + 64 values
    c = capacity(spec, gpu=141 * GiB, weights=80 * GiB, tensor_parallel_size=8, block_size=64)
    assert c.is_mla and c.kv_heads_per_gpu == 1
    assert c.block_bytes == 61 * 64 * (512 + 64) * 2 == 4_497_408  # the same at any TP size
    assert c.block_bytes == capacity(spec, gpu=141 * GiB, weights=80 * GiB, block_size=64).block_bytes
    available = int(141 * GiB * 0.9) - 80 * GiB - 2 * GiB
    assert c.num_blocks == available // 4_497_408
    assert c.blocks_per_request == 163_840 // 64 == 2560


def test_pipeline_stages_of_uneven_layers_keep_the_largest_stages_blocks():
    c = capacity(pipeline_parallel_size=3)
    # 32 layers on 3 stages: 10 each, the remainder 2 to the stages before the last: 11, 11, 10
    assert c.num_layers_largest_stage == 11 and c.num_layers_per_group == 11
    assert c.block_bytes == 11 * 65_536
    assert c.num_blocks == (77_309_411_328 - 16_060_522_496 - 2 * GiB) // (11 * 65_536)
    assert c.num_tokens == c.num_blocks * 16


def test_alternating_sliding_and_full_layers_form_two_groups():
    spec = catalog_entry("Gemma-2-9B").spec  # 42 layers alternating 4,096-token window / full; 8 x 256
    c = capacity(spec, gpu=80 * GiB, weights=18 * GiB, activations=GiB)
    page = 16 * 8 * 2 * 256 * 2
    # 21 sliding and 21 full layers: group size 21, one group each; a block is 21 pages
    assert c.num_kv_cache_groups == 2 and c.block_bytes == 21 * page
    available = 77_309_411_328 - 19 * GiB
    assert c.num_blocks == available // (21 * page)
    assert c.num_tokens == c.num_blocks // 2 * 16
    # full: 8,192 / 16 = 512 blocks; sliding: cdiv(min(4,095 + 8,192, 8,192), 16) + 1 = 513
    assert c.blocks_per_request == 512 + 513
    staged = capacity(spec, gpu=80 * GiB, weights=18 * GiB, activations=GiB, pipeline_parallel_size=4)
    # stages of 10, 11, 11, 10 layers; an 11-layer stage holds 6 of one kind: 6 pages share a block
    assert staged.block_bytes == 6 * page and staged.num_kv_cache_groups == 2


def five_to_one(num_layers: int) -> ModelSpec:
    """A Gemma-3-like stack: five 1,024-token sliding layers, then one global layer."""
    windows = tuple(None if (i + 1) % 6 == 0 else 1024 for i in range(num_layers))
    return ModelSpec("five-to-one", num_layers, 8, 4, 128, sliding_windows=windows, max_context=32768)


def test_five_to_one_pattern_is_cut_into_groups_of_the_rarer_kind():
    c = capacity(five_to_one(12), weights=10 * GiB)
    page = 16 * 4 * 2 * 128 * 2
    # 10 sliding, 2 full: group size 2 (10 >= 1.5 x 2): 5 sliding groups + 1 full group, 2 layers each
    assert c.num_kv_cache_groups == 6 and c.num_layers_per_group == 2 and c.block_bytes == 2 * page
    available = 77_309_411_328 - 12 * GiB
    assert c.num_blocks == available // (2 * page)
    assert c.num_tokens == c.num_blocks // 6 * 16
    # full: 32,768 / 16 = 2,048; sliding: cdiv(min(1,023 + 8,192, 32,768), 16) + 1 = 576 + 1 = 577
    assert c.blocks_per_request == 2048 + 5 * 577
    # two stages of 6 layers: each holds one layer of every group, so one page per block
    assert capacity(five_to_one(12), weights=10 * GiB, pipeline_parallel_size=2).block_bytes == page


def test_nearly_equal_kinds_are_padded_to_the_larger():
    windows = (512,) * 12 + (None,) * 13  # 12 sliding + 13 full: 13 < 1.5 x 12, so group size 13
    spec = ModelSpec("12+13", 25, 8, 8, 64, sliding_windows=windows, max_context=4096)
    c = capacity(spec, weights=GiB)
    assert c.num_kv_cache_groups == 2 and c.block_bytes == 13 * 16 * 8 * 2 * 64 * 2


def test_vllm_refusals_carry_its_reason():
    with pytest.raises(KVLibError, match="no available memory for the cache blocks"):
        capacity(gpu=16 * GiB)
    # 100 blocks of 2 MiB (+5 bytes) fit: the longest request is 100 x 16 = 1,600 tokens
    gpu = LLAMA3_WEIGHTS + 2 * GiB + 100 * 2_097_152 + 5
    with pytest.raises(KVLibError, match="the estimated maximum model length is 1,600;"):
        capacity(gpu=gpu, gpu_memory_utilization=1.0)
    assert capacity(gpu=gpu, gpu_memory_utilization=1.0, max_model_len=1600).num_blocks == 100
    with pytest.raises(
        KVLibError, match=r"attention heads \(32\) must be divisible by tensor parallel size \(3\)"
    ):
        capacity(tensor_parallel_size=3)


@pytest.mark.parametrize(
    "name, why", [("Jamba-v0.1", "without a KV cache"), ("Whisper-large-v3", "cross-attention")]
)
def test_shapes_kvlib_does_not_model_for_vllm_are_refused(name, why):
    with pytest.raises(KVLibError, match=why):
        capacity(catalog_entry(name).spec, gpu=141 * GiB, weights=GiB)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(gpu_memory_utilization=math.inf), "gpu_memory_utilization must be a number in"),
        (dict(gpu_memory_utilization=0), "gpu_memory_utilization must be a number in"),
        (dict(gpu_memory_utilization=True), "gpu_memory_utilization must be a number in"),
        (dict(block_size=0), "block_size must be an integer >= 1"),
        (dict(block_size=1.5), "block_size must be an integer >= 1"),
        (dict(max_model_len=0), "max_model_len must be an integer >= 1"),
        (dict(gpu=80.0 * GiB), "gpu_memory_bytes must be an integer"),
        (dict(activations=-1), "peak_activation_bytes must be an integer >= 0"),
        (dict(spec="Llama-3-8B"), "expected a ModelSpec"),
        (dict(kv_cache_dtype=None), "kv_cache_dtype and model_dtype must be names"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1"),
        (dict(pipeline_parallel_size=33), "exceeds the 32 layers"),
    ],
)
def test_bad_inputs_are_named(kw, message):
    with pytest.raises(KVLibError, match=message):
        capacity(**kw)


def test_every_input_maps_to_a_vllm_flag():
    inputs = set(inspect.signature(vllm_capacity.vllm_capacity).parameters) - {"spec"}
    assert inputs == set(VLLM_FLAGS)
    assert set(capacity_command.CLI_INPUTS.values()) == set(VLLM_FLAGS)
    for flag in ("--gpu-memory-utilization", "--block-size", "--max-model-len", "--kv-cache-dtype"):
        assert flag in VLLM_FLAGS[capacity_command.CLI_INPUTS[flag]]
    assert "--tensor-parallel-size" in VLLM_FLAGS["tensor_parallel_size"]
    assert "--pipeline-parallel-size" in VLLM_FLAGS["pipeline_parallel_size"]


# ------------------------------------------------------------------ the command


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m kvlib capacity ...`` as kvlib.cli.main runs a command (one line and 2 on KVLibError)."""
    parser = _Parser(prog="python -m kvlib")
    capacity_command.add_parser(parser.add_subparsers(dest="command", parser_class=_Parser))
    try:
        args = parser.parse_args(["capacity", *argv])
        status = args.func(args)
    except SystemExit as stop:
        status = stop.code
    except KVLibError as error:
        print(f"kvlib: error: {error}", file=__import__("sys").stderr)
        status = 2
    out, err = capsys.readouterr()
    return status, out, err


def test_command_prints_vllms_lines(capsys):
    status, out, err = run(["Llama-3-8B", "--gpu-memory-gib", "80", "--activation-gib", "2"], capsys)
    assert status == 0 and err == ""
    # weights estimated: 8,030,261,248 bf16 parameters = 16,060,522,496 B on one GPU
    blocks = (77_309_411_328 - 16_060_522_496 - 2 * GiB) // 2_097_152
    assert f"GPU KV cache size: {blocks * 16:,} tokens" in out
    assert f"Maximum concurrency for 8,192 tokens per request: {blocks / 512:.2f}x" in out


def test_command_json_and_config_path(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "hidden_size": 512,
                "max_position_embeddings": 2048,
            }
        )
    )
    argv = [str(config), "--gpu-memory-gib", "1", "--activation-gib", "0.25", "--json"]
    status, out, err = run(argv, capsys)
    assert status == 2 and "--weight-gib is needed for a config.json" in err
    status, out, err = run([*argv, "--weight-gib", "0.25", "--gpu-memory-utilization", "1"], capsys)
    assert status == 0, err
    result = json.loads(out)
    # 1 GiB - 0.25 - 0.25 = 0.5 GiB; a block: 4 layers x 16 tokens x 2 heads x 2 x 64 values x 2 bytes
    assert result["block_bytes"] == 4 * 16 * 2 * 2 * 64 * 2 == 32_768
    assert result["num_blocks"] == (GiB // 2) // 32_768 == 16_384
    assert result["log_lines"][1] == "GPU KV cache size: 262,144 tokens"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gpu-memory-gib", "inf"], "--gpu-memory-gib must be a finite number of GiB"),
        (["--gpu-memory-gib", "nan"], "--gpu-memory-gib must be a finite number of GiB"),
        (["--gpu-memory-gib", "1e-12"], "--gpu-memory-gib must be at least one byte"),
        (["--gpu-memory-gib", "1e300"], "--gpu-memory-gib must be between 0 and"),
        (["--activation-gib", "-1"], "--activation-gib must be between 0 and"),
        (["--block-size", "1.5"], "invalid int value"),
        (["--gpu-memory-utilization", "2"], "gpu_memory_utilization must be a number in"),
        (["--tensor-parallel-size", "5"], "must be divisible by tensor parallel size (5)"),
        (["--kv-cache-dtype", "int8"], "vLLM has no --kv-cache-dtype 'int8'"),
    ],
)
def test_command_bad_input_is_one_line(capsys, extra, message):
    argv = ["Llama-3-8B", "--gpu-memory-gib", "80", "--activation-gib", "2", *extra]
    status, out, err = run(argv, capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvlib: error: ") and message in err


def test_command_warns_beyond_the_maximum_context(capsys):
    argv = ["Llama-3-8B", "--gpu-memory-gib", "80", "--activation-gib", "2", "--max-model-len", "16384"]
    status, out, err = run(argv, capsys)
    assert status == 0 and "exceeds Llama-3-8B's maximum of 8,192 tokens" in err


def test_the_capacity_parser_works_with_a_plain_parser():
    parser = argparse.ArgumentParser()
    capacity_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["capacity", "Llama-3-8B", "--gpu-memory-gib", "80", "--activation-gib", "2"])
    assert args.func is capacity_command.run and args.block_size == 16


# ------------------------------------------------------------------ fuzz: an independent reference


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(["Llama-2-7B", "Llama-3-8B", "Qwen2.5-7B", "Falcon-7B", "OPT-13B", "DeepSeek-V3"]),
    tp=st.sampled_from([1, 2, 4, 8, 16, 64]),
    pp=st.integers(1, 40),
    block=st.sampled_from([1, 8, 16, 32, 64, 128]),
    gpu_gib=st.floats(0.5, 2000),
    utilization=st.floats(0.05, 1.0),
)
def test_uniform_models_match_a_reference(name, tp, pp, block, gpu_gib, utilization):
    spec = catalog_entry(name).spec
    gpu = int(gpu_gib * GiB)
    try:
        c = capacity(
            spec,
            gpu=gpu,
            weights=GiB,
            activations=GiB,
            gpu_memory_utilization=utilization,
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            block_size=block,
        )
    except KVLibError as error:
        assert "\n" not in str(error)
        return
    heads = 1 if spec.is_mla else max(1, spec.num_kv_heads // tp)
    values = spec.kv_lora_rank + spec.qk_rope_head_dim if spec.is_mla else 2 * spec.head_dim
    largest_stage = -(-spec.num_layers // pp)  # vLLM's stages differ by at most one layer
    available = int(gpu * utilization - 2 * GiB)
    expected_blocks = available // (largest_stage * block * heads * values * 2)
    assert c.num_blocks == expected_blocks and c.num_tokens == expected_blocks * block
    assert c.max_concurrency == expected_blocks / -(-spec.max_context // block)
