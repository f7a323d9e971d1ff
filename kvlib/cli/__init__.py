"""The ``python -m kvlib`` command line: five subcommands, one module each.

- ``env`` (:mod:`kvlib.cli.env`): the hardware report every measuring chapter prints first (chapter 0).
- ``bench`` (:mod:`kvlib.cli.bench`): each chapter's benchmark (:data:`kvlib.cli.bench.BENCH_MODULES`),
  as a table or JSON.
- ``size`` (:mod:`kvlib.cli.size`): the KV-cache bytes of a catalog model or a ``config.json``
  (chapter 2), per GPU under tensor and pipeline parallelism.
- ``capacity`` (:mod:`kvlib.cli.capacity`): the KV cache vLLM's engine would allocate on one GPU
  and the lines it would log (chapter 2).
- ``train`` (:mod:`kvlib.cli.train`): chapter 7's model from its seed, or an uptrained pooled copy.

Each command module has ``add_parser(subparsers)``, which adds its flags, and ``run(args) -> int``,
its handler; :data:`COMMANDS` lists them in the order ``--help`` shows. A command imports what it
needs when it runs, so that ``size`` (pure arithmetic) starts without loading torch. Bad input
never ends in a traceback: argument errors and :class:`kvlib.KVLibError` print one line
``kvlib: error: ...`` on stderr and exit with status 2; output piped into a reader that stops
early (``| head``) ends quietly.
"""

from __future__ import annotations

import argparse
import os
import sys

from kvlib import KVLibError
from kvlib.cli import bench, capacity, env, size, train

COMMANDS = (env, bench, size, capacity, train)
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse's signature
        sys.stderr.write(f"kvlib: error: {message} (see `python -m kvlib {self._sub_name()}--help`)\n")
        sys.exit(EXIT_USAGE)

    def _sub_name(self) -> str:
        parts = self.prog.split()
        return " ".join(parts[3:]) + " " if len(parts) > 3 else ""


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m kvlib``, each command of :data:`COMMANDS` registered by its module."""
    parser = _Parser(prog="python -m kvlib", description="Tools and benchmarks of the kvbook library.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


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
