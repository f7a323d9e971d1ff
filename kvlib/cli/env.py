"""``python -m kvlib env``: the hardware report every measuring chapter prints first (chapter 0)."""

from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    """Add ``env`` to the subparsers of ``python -m kvlib``."""
    env = subparsers.add_parser(
        "env", help="print the hardware report (the banner of every measuring chapter)"
    )
    env.add_argument("--json", action="store_true", help="print one JSON object")
    env.set_defaults(func=run)


def run(args) -> int:
    """Print :func:`kvlib.measure.hardware.hardware_report` as its banner, or as JSON with ``--json``."""
    from kvlib.measure.hardware import hardware_report

    report = hardware_report()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.banner())
    return 0
