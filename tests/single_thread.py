"""An autouse fixture that runs a test module's tests on one torch thread.

Import it into a test module (``from tests.single_thread import one_torch_thread  # noqa: F401``).
On a small machine shared with other programs, two-thread kernels spend most of a short
test waiting for each other at barriers; one thread keeps the tests quick and steady.
"""

import pytest

from kvlib.measure.timing import torch_threads


@pytest.fixture(autouse=True)
def one_torch_thread():
    with torch_threads(1):
        yield
