"""``make nbval``: strict nbval over every notebook of _toc.yml, in two lanes at once.

    python -m tests.nbval_lanes [PYTEST_ARGS...]     # both lanes; exit status 1 if either fails
    python -m tests.nbval_lanes --lane timing         # one lane alone

A machine with two cores runs the book's notebooks in about two thirds of the time when two of
them run at once, and the book's claims are written to hold on a busy machine (``make robust``
runs them beside a process that burns a core). The lanes are chosen so that the second core's
work is the kind that claim was proven against:

- ``timing``: the chapters whose guaranteed claims time memory-bound work (DRAM probes, decode
  attention over caches four times the last-level cache, the cost of paging): they run one
  after another, as always;
- ``compute``: the chapters whose results are simulated, modelled, or measured on a small model
  that lives in the caches (chapter 4's calibration and real engine, chapter 5's levers,
  chapter 7's quality sweep, chapter 8's engines): besides the timing lane they are a busy core,
  with little memory traffic, and their own timed claims are sanity bounds.

Each lane is one pytest process (its own kernels, in notebook order); their outputs are printed
one after the other when both have finished, each with its time.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.toc import ROOT, toc_notebooks

NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]
COMPUTE = (
    "04_serving",
    "05_levers",
    "07_quality",
    "08_serving_engines",
    "10_window_allocator",
    "11_radix_routing",
    "12_offload_tier",
)  # the rest is the timing lane


def lanes() -> dict[str, list[str]]:
    """Lane -> its notebooks (paths relative to the root, in book order); every notebook of _toc.yml
    is in exactly one lane."""
    notebooks = [path.relative_to(ROOT).as_posix() for path in toc_notebooks()]
    compute = [n for n in notebooks if Path(n).stem in COMPUTE]
    return {"timing": [n for n in notebooks if n not in compute], "compute": compute}


def run(lane_names: list[str], pytest_args: list[str]) -> int:
    """Run the lanes at once; print each one's output and time; the first non-zero status, or 0."""
    chosen = {name: notebooks for name, notebooks in lanes().items() if name in lane_names and notebooks}
    started, procs = time.monotonic(), {}
    try:
        for name, notebooks in chosen.items():
            log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
            cmd = [sys.executable, "-m", "pytest", "-q", *NBVAL, *pytest_args, *notebooks]
            procs[name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log)
            print(f"nbval lane {name}: {' '.join(Path(n).stem for n in notebooks)}", flush=True)
        statuses = {}
        for name, (proc, log) in procs.items():
            statuses[name] = proc.wait()
            log.seek(0)
            print(
                f"\n==== nbval lane {name} (exit {statuses[name]}, {time.monotonic() - started:.0f} s) ===="
            )
            print(log.read(), end="", flush=True)
    except KeyboardInterrupt:
        for proc, _ in procs.values():
            proc.terminate()
        raise
    failed = [name for name, status in statuses.items() if status]
    print(
        f"nbval: {len(chosen)} lanes in {time.monotonic() - started:.0f} s"
        + (f"; failed: {failed}" if failed else "")
    )
    return statuses[failed[0]] if failed else 0


def main(argv: list[str]) -> int:
    """The command line (see the module's docstring)."""
    names = list(lanes())
    if argv[:1] == ["--lane"]:
        if len(argv) < 2 or argv[1] not in names:
            print(f"nbval_lanes: --lane takes one of {', '.join(names)}", file=sys.stderr)
            return 2
        names, argv = [argv[1]], argv[2:]
    return run(names, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
