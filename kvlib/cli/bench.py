"""``python -m kvlib bench``: each chapter's benchmark on this machine, as a table or JSON.

:data:`BENCH_MODULES` names the sections and the module of each; each module defines
``bench() -> dict``, imported only when its section runs.
"""

from __future__ import annotations

import importlib
import json
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


def add_parser(subparsers) -> None:
    """Add ``bench`` to the subparsers of ``python -m kvlib``."""
    bench = subparsers.add_parser("bench", help="run the book's benchmarks on this machine")
    bench.add_argument("--json", action="store_true", help="print one JSON object with numeric fields")
    bench.add_argument(
        "--only", nargs="+", metavar="SECTION", help=f"run only these sections ({', '.join(BENCH_MODULES)})"
    )
    bench.set_defaults(func=run)


def run(args) -> int:
    """Run the sections (``--only``, or all), timing each on stderr; print the merged results."""
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
