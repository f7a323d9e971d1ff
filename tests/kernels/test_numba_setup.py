"""The numba kernels cache their code under a fingerprint of all their sources, and run on torch's threads."""

import shutil

import pytest

numba = pytest.importorskip("numba")

from kvlib.kernels import numba_setup  # noqa: E402
from kvlib.kernels.numba_setup import KERNEL_SOURCES, cached_njit, fingerprint, kernel_cache_dir  # noqa: E402


def test_the_fingerprint_changes_with_any_kernel_source(tmp_path):
    source_dir = numba_setup.__file__.rsplit("/", 1)[0]
    for name in KERNEL_SOURCES:
        shutil.copy(f"{source_dir}/{name}", tmp_path / name)
    assert fingerprint(tmp_path) == fingerprint() and len(fingerprint()) == 12
    seen = {fingerprint()}
    for name in KERNEL_SOURCES:  # an edit to any one of them (a git pull, say) is a new directory
        original = (tmp_path / name).read_text()
        (tmp_path / name).write_text(original + "\n# edited\n")
        seen.add(fingerprint(tmp_path))
        (tmp_path / name).write_text(original)
    assert len(seen) == 1 + len(KERNEL_SOURCES)


def test_cached_functions_live_in_the_fingerprinted_directory_and_leave_the_setting_alone():
    before = numba.config.CACHE_DIR

    @cached_njit()
    def double(x):
        return 2 * x

    assert numba.config.CACHE_DIR == before
    assert double(21) == 42
    assert kernel_cache_dir().name == f"numba-{fingerprint()}"
    if not before:  # NUMBA_CACHE_DIR unset: our directory
        assert str(kernel_cache_dir()) in double._cache._cache_path


def test_a_readers_numba_cache_dir_wins(monkeypatch, tmp_path):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))

    @cached_njit()
    def triple(x):
        return 3 * x

    assert triple(2) == 6 and triple._cache._cache_path.startswith(str(tmp_path))
    assert numba.config.CACHE_DIR == str(tmp_path)


def test_numba_runs_on_torchs_thread_count():
    import torch

    from kvlib.measure.timing import torch_threads

    with torch_threads(1):
        assert numba_setup.use_numba_threads() == 1 == numba.get_num_threads()
    with torch_threads(numba.config.NUMBA_NUM_THREADS):
        expected = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
        assert numba_setup.use_numba_threads() == expected == numba.get_num_threads()


def test_starting_numbas_threads_keeps_torchs_thread_count():
    """numba's OpenMP pool, started by its first parallel kernel, would set torch's thread count to
    numba's maximum (chapter 1 runs on one thread); a fresh process shows that it stays."""
    import os
    import subprocess
    import sys

    code = (
        "import torch; torch.set_num_threads(1)\n"
        "from kvlib.kernels.pool_decoder import PoolDecoder\n"
        "from kvlib.kernels.dispatch import contiguous_tables\n"
        "k, q = torch.randn(1, 64, 2, 16), torch.randn(1, 2, 1, 16)\n"
        "PoolDecoder([k], [k]).attend(0, q, contiguous_tables(1, 1), torch.tensor([64]), 64)\n"
        "print(torch.get_num_threads())\n"
    )
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "1"
