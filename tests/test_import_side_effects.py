"""Importing kvlib changes nothing outside it: every module imported, in a fresh interpreter, leaves
the environment, pandas' and numpy's print options, torch's settings, warnings and logging as they were."""

import json
import subprocess
import sys

from tests.layout import modules

PROBE = r"""
import importlib, json, logging, os, sys, warnings
import numpy, pandas, torch

def state():
    return {
        "environ": dict(os.environ),
        "pandas": {k: repr(pandas.get_option(k)) for k in
                   ("display.max_columns", "display.max_colwidth", "display.width", "display.max_rows")},
        "numpy": repr(numpy.get_printoptions()),
        "torch": [torch.get_num_threads(), str(torch.get_default_dtype()),
                  torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(),
                  torch.is_grad_enabled()],
        "warnings": repr(warnings.filters),
        "logging": [logging.getLogger().level, len(logging.getLogger().handlers)],
        "path": list(sys.path),
    }

before = state()
skipped = []
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError as error:  # an optional accelerator library (Triton) that is not installed
        skipped.append(f"{name}: {error}")
after = state()
print(json.dumps({"changed": {k: [before[k], after[k]] for k in before if before[k] != after[k]},
                  "skipped": skipped}))
"""


def test_importing_every_module_changes_nothing_outside_kvlib():
    names = sorted(set(modules()) - {"kvlib.__main__"})  # __main__ runs the command line
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(names)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["changed"] == {}, report["changed"]
    assert all("triton" in line for line in report["skipped"]), report["skipped"]
