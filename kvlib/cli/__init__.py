"""The ``python -m kvlib`` command line: ``env``, ``bench`` and the chapters' tools.

- ``env``: the hardware report every measuring chapter prints first (chapter 0).
- ``bench``: each chapter's benchmark (chapters 0 to 4, 7 and 8, :data:`BENCH_MODULES`), as a table or JSON.
- ``size``: the KV-cache bytes of a catalog model or a ``config.json`` (chapter 2,
  :mod:`kvlib.sizing.capacity`), per GPU under ``--tensor-parallel-size`` and
  ``--pipeline-parallel-size`` as vLLM splits it (:mod:`kvlib.sizing.parallel`); a context
  beyond the model's maximum is sized with a warning on stderr.
- ``capacity``: the KV cache vLLM's engine would allocate on one GPU and the lines it would log
  (chapter 2, :mod:`kvlib.cli.capacity`).

Each command imports what it needs when it runs, so that ``size`` (pure arithmetic) starts
without loading torch. Bad input never ends in a traceback: argument errors and :class:`kvlib.KVLibError`
print one line ``kvlib: error: ...`` on stderr and exit with status 2; output piped into a
reader that stops early (``| head``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

from kvlib import KVLibError

# The sections of ``python -m kvlib bench`` and the module of each; each module defines ``bench() -> dict``.
BENCH_MODULES = {
    "measure": "kvlib.measure.probes",  # chapter 0: DRAM bandwidth, matmul FLOP/s
    "nocache": "kvlib.chapters.ch01_no_cache.nocache_race",  # chapter 1: no cache against a cache
    # chapter 2: decode attention for each number of KV heads
    "decode": "kvlib.chapters.ch02_cache_size.decode_speed",
    # chapter 3: the paged kernel against the contiguous one
    "paged": "kvlib.chapters.ch03_paged_attention.kernel_overhead",
    "serving": "kvlib.chapters.ch04_serving.policy_comparison",  # chapter 4: the placement policies
    # chapter 4: rate at equal latency, TTFT and TPOT (A100)
    "latency": "kvlib.chapters.ch04_serving.rate_comparison",
    # chapter 7: what each lossy lever costs the trained model
    "quality": "kvlib.chapters.ch07_quality.tradeoffs",
    # chapter 8: chunked prefill's TTFT/TPOT trade-off
    "chunked": "kvlib.chapters.ch08_serving_engines.chunked_prefill",
    "swap": "kvlib.chapters.ch08_serving_engines.swap_analysis",  # chapter 8: swapping against recomputation
    # chapter 8: speculative decoding on the paged cache
    "speculative": "kvlib.chapters.ch08_serving_engines.speculative_bench",
    # chapter 8: prefix caching, predicted and measured
    "prefix": "kvlib.chapters.ch08_serving_engines.prefix_simulation",
    # chapter 8: the cache over GPUs, disaggregated prefill
    "multigpu": "kvlib.chapters.ch08_serving_engines.disaggregation",
    # chapter 8: kvlib's knobs mapped to vLLM's flags
    "vllm": "kvlib.chapters.ch08_serving_engines.vllm_flags",
    "mla": "kvlib.chapters.ch09_mla_absorbed.bench",  # chapter 9: MLA decoded with the weights absorbed
    "window": "kvlib.chapters.ch10_window_allocator.bench",  # chapter 10: windows and hybrids, paged
    "radix": "kvlib.chapters.ch11_radix_routing.bench",  # chapter 11: a radix prefix tree, routing
    "offload": "kvlib.chapters.ch12_offload_tier.bench",  # chapter 12: the offload tier, swap per block
}

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse's signature
        sys.stderr.write(f"kvlib: error: {message} (see `python -m kvlib {self._sub_name()}--help`)\n")
        sys.exit(EXIT_USAGE)

    def _sub_name(self) -> str:
        parts = self.prog.split()
        return " ".join(parts[3:]) + " " if len(parts) > 3 else ""


def _cmd_env(args) -> int:
    from kvlib.measure.hardware import hardware_report

    report = hardware_report()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.banner())
    return 0


def _cmd_bench(args) -> int:
    unknown = sorted(set(args.only or ()) - set(BENCH_MODULES))
    if unknown:
        raise KVLibError(f"unknown bench section {unknown[0]!r}; choose from {', '.join(BENCH_MODULES)}")
    results: dict = {}
    for name in args.only or BENCH_MODULES:
        start = time.perf_counter()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        results.update(importlib.import_module(BENCH_MODULES[name]).bench())
        print(f"bench: {name} done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results))
    else:
        width = max(map(len, results), default=0)
        for key, value in results.items():
            print(f"{key:<{width}}  {value}")
    return 0


def _cmd_size(args) -> int:
    from kvlib.cli.capacity import check_parallel_flags, report_ignored_keys
    from kvlib.sizing.capacity import format_summary, size_summary

    check_parallel_flags(args)
    summary = size_summary(
        args.model,
        args.context,
        args.batch,
        args.kv_dtype,
        args.tensor_parallel_size,
        args.pipeline_parallel_size,
        args.encoder_tokens,
        args.image_tokens,
    )
    if summary["exceeds_max_context"]:
        sys.stderr.write(
            f"kvlib: warning: context {summary['context']:,} exceeds {summary['model']}'s maximum of "
            f"{summary['max_context']:,} tokens (sized anyway, as for a RoPE-scaled context)\n"
        )
    if args.verbose:
        report_ignored_keys(args.model)
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m kvlib`` and its four subcommands."""
    parser = _Parser(prog="python -m kvlib", description="Tools and benchmarks of the kvbook library.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    env = sub.add_parser("env", help="print the hardware report (the banner of every measuring chapter)")
    env.add_argument("--json", action="store_true", help="print one JSON object")
    env.set_defaults(func=_cmd_env)

    bench = sub.add_parser("bench", help="run the book's benchmarks on this machine")
    bench.add_argument("--json", action="store_true", help="print one JSON object with numeric fields")
    bench.add_argument(
        "--only", nargs="+", metavar="SECTION", help=f"run only these sections ({', '.join(BENCH_MODULES)})"
    )
    bench.set_defaults(func=_cmd_bench)

    size = sub.add_parser("size", help="KV-cache bytes of a model: a catalog name or a config.json path")
    size.add_argument("model", help="catalog name (e.g. Llama-3-8B) or path to a Hugging Face config.json")
    size.add_argument("--context", type=int, required=True, help="tokens per sequence (prompt + generated)")
    size.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    size.add_argument("--kv-dtype", default="fp16", choices=("fp32", "fp16", "bf16", "fp8", "int8", "int4"))
    size.add_argument(
        "--tensor-parallel-size", type=int, default=1, metavar="N", help="GPUs splitting each layer's heads"
    )
    size.add_argument(
        "--pipeline-parallel-size", type=int, default=1, metavar="P", help="GPUs splitting the layers"
    )
    size.add_argument(
        "--encoder-tokens", type=int, metavar="T", help="encoder positions cross-attended (T5, BART, Whisper)"
    )
    size.add_argument(
        "--image-tokens", type=int, metavar="T", help="image tokens cross-attended (Llama-3.2-Vision)"
    )
    size.add_argument("--json", action="store_true", help="print one JSON object")
    size.add_argument(
        "--verbose",
        action="store_true",
        help="list on stderr the config keys kvlib ignores (none can change the KV cache)",
    )
    size.set_defaults(func=_cmd_size)

    from kvlib.cli.capacity import add_capacity_command

    add_capacity_command(sub)  # capacity: the KV cache vLLM would allocate, and what it would log
    _add_train_command(sub)
    return parser


def _cmd_train(args) -> int:
    from kvlib.cli.train import run_train

    return run_train(args)


def _add_train_command(sub) -> None:
    """``train``: chapter 7's model from its seed, or an uptrained pooled copy (kvlib/cli/train.py)."""
    p = sub.add_parser("train", help="train chapter 7's model (or uptrain a pooled copy) into a file")
    p.add_argument("--out", required=True, help="where to write the .safetensors file (and its .sha256)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 2000, uptraining 5%%)")
    p.add_argument("--batch-size", type=int, default=8, help="documents per step")
    p.add_argument("--data-seed", type=int, default=None, help="seed of the documents (default 0; uptrain 1)")
    p.add_argument("--uptrain", metavar="FILE", help="start from this model, converted to --num-kv-heads")
    p.add_argument("--num-kv-heads", type=int, help="K/V heads of the converted model (with --uptrain)")
    p.add_argument("--pool", choices=("mean", "keep"), default="mean", help="how K/V heads are merged")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_train)


def main(argv: list[str] | None = None) -> int:
    """Run one command (``argv``: the arguments after ``python -m kvlib``); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()
        return status
    except KVLibError as error:
        sys.stderr.write(f"kvlib: error: {one_line(str(error))}\n")
        return EXIT_USAGE
    except BrokenPipeError:  # the reader stopped reading (| head): not an error of ours
        _silence_stdout()
        return 0


def one_line(message: str) -> str:
    """A message as one line: a value quoted in it (a name from a config) may hold a line break."""
    return " ".join(message.splitlines())


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's flush at exit does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (captured in tests)
        pass
