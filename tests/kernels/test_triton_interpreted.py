"""The Triton kernel in Triton's interpreter on the CPU (tests/kernels/triton_interpreted.py).

Triton is not among the pins (PyTorch's CPU wheels do not bring it, and a 290 MB download would
double the install), so in ``make test`` on a CPU-only machine this skips with that reason;
``make triton-interpreted`` installs the pinned Triton aside (.triton-cpu/) and runs it. On a CUDA
machine tests/kernels/test_triton_decode.py runs the kernel itself instead. Marked slow (about
1.5 minutes: the interpreter steps through every program instance in numpy).
"""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None,
        reason="Triton is not installed (CPU PyTorch wheels lack it); make triton-interpreted runs this",
    ),
    pytest.mark.skipif(
        torch.cuda.is_available(), reason="a GPU is present: test_triton_decode.py runs the kernel"
    ),
]


def test_the_interpreted_triton_kernel_equals_the_reference_and_keeps_the_tokens():
    run = subprocess.run(
        [sys.executable, "-m", "tests.kernels.triton_interpreted"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
