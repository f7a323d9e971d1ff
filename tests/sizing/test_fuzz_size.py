"""Fuzzing ``python -m kvlib size`` over configs and arguments (hypothesis).

Every run either exits 0 with the bytes an independent reference (written here, one layer at
a time, from transformers' rules) gives, or exits 2 with one line on stderr; never a
traceback. Valid configs of every layer-pattern spelling must be sized; corrupted ones (a bad
value, an unknown size-relevant key) must be refused. In-process through
:func:`kvlib.cli.main`; a few real subprocesses at the end.
"""

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvlib.cli import main

DTYPES = {
    "fp32": (32, None),
    "fp16": (16, None),
    "bf16": (16, None),
    "fp8": (8, None),
    "int8": (8, 32),
    "int4": (4, 32),
}


def vector_bytes(n, dtype):
    bits, group = DTYPES[dtype]
    data = -(-n * bits // 8)
    return data + (-(-n // group) * 4 if group else 0)


@st.composite
def configs(draw):
    """(config, per-layer list of tokens-kept rules, kv heads, head_dim): rule None = no cache,
    ("all",) = every token, ("cap", w) = at most w."""
    layers = draw(st.integers(1, 64))
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv * draw(st.sampled_from([1, 2, 3, 4]))
    head_dim = draw(st.sampled_from([8, 64, 80, 128, 256]))
    config = {"model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": head_dim, "max_position_embeddings": 4096}  # fmt: skip
    window = draw(st.integers(1, 5000))
    shape = draw(
        st.sampled_from(["dense", "mistral", "layer_types", "pattern", "indices", "hybrid", "period"])
    )
    rules = [("all",)] * layers
    if shape == "mistral":
        config["sliding_window"] = window
        rules = [("cap", window)] * layers
    elif shape == "layer_types":
        types = draw(st.lists(st.sampled_from(["full_attention", "sliding_attention", "mamba", "attention"]),
                              min_size=layers, max_size=layers))  # fmt: skip
        if all(t == "mamba" for t in types):
            types[0] = "full_attention"
        config.update(layer_types=types, sliding_window=window)
        table = {"full_attention": ("all",), "attention": ("all",), "sliding_attention": ("cap", window)}
        rules = [table.get(t) for t in types]
    elif shape == "pattern":
        pattern = draw(st.integers(1, 8))
        config.update(model_type="gemma3_text", sliding_window=window, sliding_window_pattern=pattern)
        rules = [("all",) if (i + 1) % pattern == 0 else ("cap", window) for i in range(layers)]
    elif shape == "indices":
        chosen = sorted(draw(st.sets(st.integers(0, layers - 1), min_size=1)))
        config["attn_layer_indices"] = chosen
        rules = [("all",) if i in chosen else None for i in range(layers)]
    elif shape == "hybrid":
        letters = draw(st.lists(st.sampled_from("M-*E"), min_size=layers, max_size=layers))
        if "*" not in letters:
            letters[-1] = "*"
        config["hybrid_override_pattern"] = "".join(letters)
        rules = [("all",) if c == "*" else None for c in letters]
    elif shape == "period":
        period = draw(st.integers(1, 8))
        offset = draw(st.integers(0, period - 1))
        if offset >= layers:
            offset = 0
        config.update(attn_layer_period=period, attn_layer_offset=offset)
        rules = [("all",) if i % period == offset else None for i in range(layers)]
    return config, rules, kv, head_dim, heads


def reference(rules, kv, head_dim, heads, context, batch, dtype, tp, pp):
    """(total bytes, per-GPU bytes or None if vLLM would refuse tp/pp), one layer at a time."""

    def kept(rule):
        return context if rule[0] == "all" else min(context, rule[1])

    def layer_bytes(rule, kv_heads):
        return 0 if rule is None else batch * kept(rule) * 2 * kv_heads * vector_bytes(head_dim, dtype)

    total = sum(layer_bytes(r, kv) for r in rules)
    if heads % tp or (kv % tp and tp % kv) or pp > len(rules):
        return total, None
    sizes = [len(rules) // pp] * pp
    for i in range(2, len(rules) % pp + 2):
        sizes[-i] += 1
    per_rank = max(1, kv // tp)
    stages, start = [], 0
    for size in sizes:
        stages.append(sum(layer_bytes(r, per_rank) for r in rules[start : start + size]))
        start += size
    return total, max(stages)


def run(capsys, argv):
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_error_line(status, out, err):
    assert status == 2 and out == "", (status, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvlib: error:"), err


def fuzz_valid(tmp_path_factory, capsys, case, context, batch, dtype, tp, pp):
    config, rules, kv, head_dim, heads = case
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(config))
    argv = ["size", str(path), "--context", str(context), "--batch", str(batch), "--kv-dtype", dtype,
            "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp), "--json"]  # fmt: skip
    status, out, err = run(capsys, argv)
    total, per_gpu = reference(rules, kv, head_dim, heads, context, batch, dtype, tp, pp)
    if per_gpu is None:
        assert_one_error_line(status, out, err)
        return
    assert status == 0, err
    data = json.loads(out)
    assert (data["total_bytes"], data["per_gpu_bytes"]) == (total, per_gpu)
    assert data["exceeds_max_context"] == (context > 4096)


CORRUPTIONS = st.sampled_from(
    [
        ("num_hidden_layers", 0), ("num_hidden_layers", -3), ("num_hidden_layers", 2.5),
        ("num_hidden_layers", "32"), ("num_hidden_layers", True), ("num_attention_heads", None),
        ("num_key_value_heads", 0), ("head_dim", 0), ("head_dim", [128]), ("sliding_window", -1),
        ("layer_types", ["mamba"]), ("attn_layer_indices", [99]), ("hybrid_override_pattern", "Q"),
        ("sliding_window_pattern_v2", 6), ("kv_group_size", 2), ("layers_block_type", ["mamba"]),
        ("attn_layer_period", 0), ("max_position_embeddings", 0), ("text_config", 7),
    ]
)  # fmt: skip


def fuzz_corrupt(tmp_path_factory, capsys, case, corruption):
    config, *_ = case
    key, value = corruption
    if value is None:
        assume(config["model_type"] != "gemma3_text")  # transformers' Gemma-3 defaults fill a missing key
        config = {k: v for k, v in config.items() if k != key}
    else:
        config = {**config, key: value}
    path = tmp_path_factory.mktemp("bad") / "config.json"
    path.write_text(json.dumps(config))
    assert_one_error_line(*run(capsys, ["size", str(path), "--context", "100"]))


ARGS = dict(
    case=configs(),
    context=st.integers(1, 10_000),
    batch=st.integers(1, 8),
    dtype=st.sampled_from(sorted(DTYPES)),
    tp=st.sampled_from([1, 2, 3, 4, 8, 16]),
    pp=st.integers(1, 70),
)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))


@FAST
@given(**ARGS)
def test_fuzz_valid_configs(tmp_path_factory, capsys, case, context, batch, dtype, tp, pp):
    fuzz_valid(tmp_path_factory, capsys, case, context, batch, dtype, tp, pp)


@FAST
@given(case=configs(), corruption=CORRUPTIONS)
def test_fuzz_corrupt_configs(tmp_path_factory, capsys, case, corruption):
    fuzz_corrupt(tmp_path_factory, capsys, case, corruption)


@pytest.mark.slow
@SLOW
@given(**ARGS)
def test_fuzz_valid_configs_slow(tmp_path_factory, capsys, case, context, batch, dtype, tp, pp):
    fuzz_valid(tmp_path_factory, capsys, case, context, batch, dtype, tp, pp)


@pytest.mark.slow
@SLOW
@given(case=configs(), corruption=CORRUPTIONS)
def test_fuzz_corrupt_configs_slow(tmp_path_factory, capsys, case, corruption):
    fuzz_corrupt(tmp_path_factory, capsys, case, corruption)


WORDS = ["--context", "--batch", "--kv-dtype", "--json", "-1", "0", "7", "1e3", "fp4", "Llama-3-8B",
         "--tensor-parallel-size", "x", "9" * 5000, "--bogus"]  # fmt: skip


@FAST
@given(argv=st.lists(st.sampled_from(WORDS), max_size=8))
def test_fuzz_arguments(capsys, argv):
    status, out, err = run(capsys, ["size", *argv])
    if status == 0:
        assert json.loads(out)["total_bytes"] > 0 if "--json" in argv else out.startswith("model")
    else:
        assert_one_error_line(status, out, err)


@pytest.mark.parametrize(
    "args",
    [
        ("Llama-3-8B", "--context", "100", "--tensor-parallel-size", "5"),
        ("DeepSeek-V3", "--context", "100", "--pipeline-parallel-size", "62"),
        ("Gemma-2-9B", "--context", "99999", "--json"),
        ("no_such_model", "--context", "1"),
    ],
)
def test_real_subprocess_runs(args):
    result = subprocess.run(
        [sys.executable, "-m", "kvlib", "size", *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr
    if result.returncode == 0:
        assert json.loads(result.stdout)["exceeds_max_context"] is True
    else:
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
