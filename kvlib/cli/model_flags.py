"""What ``size`` and ``capacity`` share: the model argument, its split over GPUs, ``--verbose``."""

from __future__ import annotations

import sys

from kvlib.checks import require_int
from kvlib.sizing.catalog import model_config
from kvlib.sizing.config_keys import ignored_keys
from kvlib.sizing.layer_groups import MAX_COUNT

MODEL_HELP = "catalog name (e.g. Llama-3-8B) or path to a Hugging Face config.json"
VERBOSE_HELP = "list on stderr the config keys kvlib ignores (none can change the KV cache)"


def check_parallel_flags(args) -> None:
    """--tensor-parallel-size and --pipeline-parallel-size: integers from 1 to kvlib's bound on counts,
    named by their flag (a larger one could not even be printed in a message)."""
    require_int(args.tensor_parallel_size, "--tensor-parallel-size", low=1, high=MAX_COUNT)
    require_int(args.pipeline_parallel_size, "--pipeline-parallel-size", low=1, high=MAX_COUNT)


def report_ignored_keys(model) -> None:
    """``--verbose``: one stderr line listing the config keys kvlib ignores (none can change the cache)."""
    keys = ignored_keys(model_config(model))
    listed = ", ".join(keys) if keys else "none"
    sys.stderr.write(f"kvlib: ignored config keys (they cannot change the KV cache): {listed}\n")
