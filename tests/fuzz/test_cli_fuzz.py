"""Property tests (hypothesis) of `python -m kvlib size` and `capacity`: hostile argv and config.json.

Each case runs :func:`kvlib.cli.main` in-process and must end in one of two ways, within
:data:`CASE_SECONDS`:

- exit 0 with sane output: the table, or (``--json``) one JSON object whose byte counts are
  non-negative integers that add up (self + cross = total; the fullest GPU holds at most the
  total; vLLM's blocks are a non-negative count), warnings on stderr allowed;
- exit 2 with exactly one stderr line, ``kvlib: error: ...``, and nothing on stdout.

Never a traceback (any other exception fails the case), never a hang (SIGALRM fails the case).
The configs are published ones (tests/sizing/fixtures and the catalog) with keys the reader knows
set to values of every JSON type, huge integers, nesting and per-layer lists of hostile lengths;
the flags get integers of every size, floats (inf, nan), junk text and repeated or missing flags.
The profile (tests/fuzz/conftest.py) sets the number of cases: 30 per test by default, 2000 with
HYPOTHESIS_PROFILE=fuzz.
"""

import contextlib
import io
import json
import signal
import tempfile
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from kvlib.cli import main
from kvlib.sizing.catalog import catalog_config, catalog_names
from kvlib.sizing.config_keys import IGNORED_KEYS, KNOWN_KEYS

FIXTURES = sorted((Path(__file__).parents[1] / "sizing" / "fixtures").glob("*.json"))
CASE_SECONDS = 10  # the alarm: a case still running then is a hang
SLOW_SECONDS = 5  # what the issue allows: "no command runs longer than a few seconds"


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"a case ran for more than {CASE_SECONDS} s")


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    """(exit status, stdout, stderr, seconds) of kvlib.cli.main(argv), SystemExit included."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exit_:  # argparse's errors (our _Parser: one line, status 2)
                status = exit_.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return status, out.getvalue(), err.getvalue(), time.perf_counter() - start


def check_outcome(argv: list[str]) -> tuple[int, str]:
    status, out, err, seconds = run_cli(argv)
    assert seconds < SLOW_SECONDS, f"{seconds:.1f} s for {argv!r:.300}"
    if status == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvlib: error: "), f"{argv!r:.300}: {err!r:.600}"
        assert out == "", f"{argv!r:.300}"
    else:
        assert status == 0, f"exit {status!r} for {argv!r:.300}: {err!r:.600}"
        assert out.strip(), f"no output for {argv!r:.300}"
        assert all(line.startswith("kvlib: ") for line in err.splitlines()), err
        if "--json" in argv:
            check_json(json.loads(out), argv[0])
    return status, out


def check_json(data: dict, command: str) -> None:
    if command == "size":
        for key in ("bytes_per_token", "self_attention_bytes", "cross_attention_bytes", "total_bytes"):
            assert isinstance(data[key], int) and data[key] >= 0, (key, data[key])
        assert data["self_attention_bytes"] + data["cross_attention_bytes"] == data["total_bytes"]
        assert 0 <= data["per_gpu_bytes"] <= data["total_bytes"]
        assert data["num_attention_layers"] <= data["num_layers"]
    else:
        for key in ("num_blocks", "block_bytes", "blocks_per_request"):
            assert isinstance(data[key], int) and data[key] >= 0, (key, data[key])
        assert data["num_blocks"] * data["block_bytes"] <= max(0, data["available_bytes"])


# ------------------------------------------------------------------ hostile values

huge_ints = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, -1, 10**12, 10**12 + 1, 2**53 + 1, 10**30, 10**300, 10**4000]),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    huge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["full_attention", "sliding_attention", "*", "M", "llama", "gemma3", "jamba"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.sampled_from(sorted(KNOWN_KEYS)), inner, max_size=4)
    ),
    max_leaves=12,
)
# per-layer lists of a hostile length: the reader must refuse or read them in bounded time
long_lists = st.builds(
    lambda item, n: item * n if isinstance(item, str) else [item] * n,
    st.sampled_from(["full_attention", "sliding_attention", "mamba", 1, 0, "*", "M", "*M"]),
    st.sampled_from([1, 31, 32, 10**5, 1_000_001, 2_000_000]),
)
config_keys = st.sampled_from(sorted(KNOWN_KEYS) + sorted(IGNORED_KEYS)[:20] + ["kv_magic", "offset_alibi"])


def base_configs():
    return [json.loads(p.read_text()) for p in FIXTURES] + [catalog_config(n) for n in catalog_names()]


BASES = base_configs()


@st.composite
def hostile_configs(draw):
    """A published config with a few keys set to hostile values (or removed), or pure junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)  # not even an object, or an object of junk
    config = dict(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(sorted(config)) if config and draw(st.booleans()) else config_keys)
        choice = draw(st.integers(0, 5))
        if choice == 0:
            config.pop(key, None)
        elif choice == 1:
            config[key] = draw(long_lists)
        else:
            config[key] = draw(json_values)
    if draw(st.integers(0, 4)) == 0 and isinstance(config.get("text_config"), dict):
        config["text_config"] = {**config["text_config"], draw(config_keys): draw(json_values)}
    return config


int_texts = st.one_of(
    huge_ints.map(str), st.sampled_from(["", "x", "1.5", "1e3", "nan", "-0", " 8", "0x10", "8" * 5000])
)
float_texts = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    huge_ints.map(str),
    st.sampled_from(["", "x", "1e400", "-1e400", "0.5", "0", "-0.0", "nan"]),
)
junk_models = st.one_of(
    st.sampled_from(catalog_names()),
    st.text(max_size=30),
    st.sampled_from(["", " ", ".", "..", "/", "a" * 300, "x.json", "__proto__", "toString", "con", "\0"]),
)


def flags(draw, table: dict) -> list[str]:
    argv = []
    for flag, values in table.items():
        if draw(st.integers(0, 2)) == 0:
            argv += [flag, draw(values)]
    return argv


SIZE_FLAGS = {
    "--batch": int_texts,
    "--kv-dtype": st.sampled_from(["fp16", "fp8", "int4", "fp32", "fp4", ""]),
    "--tensor-parallel-size": int_texts,
    "--pipeline-parallel-size": int_texts,
    "--encoder-tokens": int_texts,
    "--image-tokens": int_texts,
}
CAPACITY_FLAGS = {
    "--gpu-memory-utilization": float_texts,
    "--weight-gib": float_texts,
    "--weight-dtype": st.sampled_from(["bf16", "fp8", "int4", "fp16"]),
    "--non-torch-gib": float_texts,
    "--cuda-graph-gib": float_texts,
    "--block-size": int_texts,
    "--max-model-len": int_texts,
    "--kv-cache-dtype": st.sampled_from(["auto", "fp8", "fp8_e5m2", "int4", "", "__proto__"]),
    "--dtype": st.sampled_from(["bfloat16", "float16", "auto", "x"]),
    "--tensor-parallel-size": int_texts,
    "--pipeline-parallel-size": int_texts,
    "--max-num-batched-tokens": int_texts,
}


@st.composite
def size_argv(draw, model: str):
    argv = ["size", model]
    if draw(st.integers(0, 9)):  # --context is required: leave it out sometimes
        argv += ["--context", draw(st.one_of(int_texts, st.integers(1, 2**20).map(str)))]
    argv += flags(draw, SIZE_FLAGS)
    argv += [f for f in ("--json", "--verbose") if draw(st.booleans())]
    return argv


@st.composite
def capacity_argv(draw, model: str):
    argv = ["capacity", model]
    if draw(st.integers(0, 9)):
        argv += ["--gpu-memory-gib", draw(st.one_of(float_texts, st.sampled_from(["80", "24", "141"])))]
    if draw(st.integers(0, 9)):
        argv += ["--activation-gib", draw(st.one_of(float_texts, st.sampled_from(["1", "2.5"])))]
    argv += flags(draw, CAPACITY_FLAGS)
    argv += [f for f in ("--json", "--verbose") if draw(st.booleans())]
    return argv


def with_config(config) -> tuple[tempfile.TemporaryDirectory, str]:
    folder = tempfile.TemporaryDirectory()
    path = Path(folder.name) / "config.json"
    path.write_text(json.dumps(config))
    return folder, str(path)


@given(st.data())
def test_size_on_hostile_flags_answers_or_names_the_problem(data):
    check_outcome(data.draw(size_argv(data.draw(junk_models))))


@given(st.data())
def test_capacity_on_hostile_flags_answers_or_names_the_problem(data):
    check_outcome(data.draw(capacity_argv(data.draw(junk_models))))


@given(hostile_configs(), st.data())
def test_size_on_hostile_configs_answers_or_names_the_problem(config, data):
    folder, path = with_config(config)
    with folder:
        argv = ["size", path, "--context", str(data.draw(st.integers(1, 2**17))), "--json"]
        argv += flags(data.draw, {k: SIZE_FLAGS[k] for k in ("--tensor-parallel-size", "--image-tokens")})
        check_outcome(argv)


@given(hostile_configs(), st.data())
def test_capacity_on_hostile_configs_answers_or_names_the_problem(config, data):
    folder, path = with_config(config)
    with folder:
        argv = ["capacity", path, "--gpu-memory-gib", "80", "--activation-gib", "2", "--weight-gib", "15"]
        argv += flags(data.draw, {k: CAPACITY_FLAGS[k] for k in ("--max-model-len", "--block-size")})
        check_outcome(argv + ["--json"])


# ------------------------------------------------------------------ the cases, kept


def test_the_oracle_fails_a_traceback_and_accepts_both_good_endings(monkeypatch):
    """check_outcome itself: a raw exception from a command must fail it (the fuzz tests could not
    fail otherwise); a good answer and a one-line error must pass."""
    assert check_outcome(["size", "Llama-3-8B", "--context", "10", "--json"])[0] == 0
    assert check_outcome(["size", "Llama-3-8B", "--context", "0"])[0] == 2
    import kvlib.sizing.capacity as capacity

    def broken(*args, **kwargs):
        raise ZeroDivisionError("the kind of error the issue found")

    monkeypatch.setattr(capacity, "size_summary", broken)
    try:
        check_outcome(["size", "Llama-3-8B", "--context", "10"])
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("a traceback passed the oracle")
