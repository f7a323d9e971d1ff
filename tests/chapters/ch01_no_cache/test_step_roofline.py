"""Tests of kvlib.chapters.ch01_no_cache.step_roofline: the arithmetic of a decode step's bound (stubbed
probes, not timed)
and the operator count of the lean step."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.generation import Decoder, generate
from kvlib.chapters.ch01_no_cache import step_roofline
from kvlib.chapters.ch01_no_cache.step_roofline import (
    StepRoofline,
    count_step_ops,
    measure_decode_step,
    step_work,
)
from kvlib.kernels.dispatch import numba_module
from kvlib.measure.probes import Bandwidth, Compute
from kvlib.measure.timing import Timing
from kvlib.model.config import ModelConfig
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama
from tests.single_thread import one_torch_thread  # noqa: F401

CONFIG = ModelConfig(vocab_size=50, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=24)


def _timing(seconds):
    return Timing(seconds, seconds, seconds, (seconds,))


def test_step_work_counts_weights_kv_and_flops_by_hand():
    work = step_work(CONFIG, num_keys=10, batch=3)
    # per layer: q, o 16x16 each; k, v 16x8 each; MLP 3 x 16x24; two norms of 16
    per_layer = 2 * 256 + 2 * 128 + 3 * 384 + 2 * 16
    assert work.weight_bytes == 4 * (2 * per_layer + 16 + 16 * 50 + 3 * 16)
    kv_token = 2 * 2 * 8 * 4  # K and V, 2 layers, 2 heads x 4 dims, float32
    assert work.kv_read_bytes == 3 * 10 * kv_token and work.kv_write_bytes == 3 * kv_token
    assert work.num_bytes == work.weight_bytes + work.kv_read_bytes + work.kv_write_bytes
    attention = 2 * 2 * 4 * 4 * 10  # QK^T and weights@V: heads x head_dim x keys, per layer
    matvec = 2 * (2 * per_layer - 2 * 2 * 16 + 16 * 50)  # 2 FLOPs per projection weight
    assert work.flops == 3 * (2 * attention + matvec)
    assert step_work(CONFIG, 10, 1, torch.float16).kv_read_bytes == 10 * kv_token // 2


def test_step_work_rejects_bad_sizes():
    with pytest.raises(KVLibError, match="positive"):
        step_work(CONFIG, 0)


def test_bound_is_the_larger_of_memory_and_compute_time():
    work = step_roofline.StepWork(weight_bytes=900, kv_read_bytes=90, kv_write_bytes=10, flops=4000)
    memory_bound = StepRoofline(
        step_s=4e-6,
        work=work,
        bandwidth_bytes_per_s=1e9,
        peak_flops_per_s=2e9,
        threads=1,
        num_ops=10,
        num_allocating_ops=4,
        llc_bytes=512,
    )
    assert memory_bound.memory_s == pytest.approx(1e-6) and memory_bound.compute_s == pytest.approx(2e-6)
    assert memory_bound.bound_s == pytest.approx(2e-6)  # 4000 FLOPs at 2 GFLOP/s is the larger
    assert memory_bound.roofline_fraction == pytest.approx(0.5)
    assert memory_bound.overhead_s == pytest.approx(2e-6)
    assert memory_bound.overhead_per_op_s == pytest.approx(2e-7)
    assert not memory_bound.fits_llc


def test_measure_uses_the_given_probes_and_counts_the_step(monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("the given probes must be used, not measured again")

    monkeypatch.setattr(step_roofline, "memory_bandwidth", no_probe)
    monkeypatch.setattr(step_roofline, "matmul_probe", no_probe)
    bandwidth = Bandwidth("cpu", num_bytes=10**9, timing=_timing(0.1), threads=1)  # 10 GB/s
    compute = Compute("cpu", size=1000, dtype="float32", timing=_timing(0.02), threads=1)  # 100 GFLOP/s
    model = TinyLlama(CONFIG).eval()
    result = measure_decode_step(model, torch.zeros(2, 3, dtype=torch.long), 4, 1, bandwidth, compute)
    assert result.bandwidth_bytes_per_s == pytest.approx(1e10) and result.peak_flops_per_s == pytest.approx(
        1e11
    )
    # 3 prompt tokens + 4 warm-up steps fill 6 slots; the middle timed step (of 4) attends to 9 keys
    assert result.work == step_work(CONFIG, 9, batch=2)
    assert result.step_s > 0 and result.threads == 1 and result.lean
    if numba_module() is not None:  # the numba kernel attends into the step's buffer: nothing allocated
        assert result.num_allocating_ops == 0 < result.num_ops
    reference = measure_decode_step(
        model, torch.zeros(2, 3, dtype=torch.long), 4, 1, bandwidth, compute, lean=False
    )
    assert not reference.lean and type(model) is TinyLlama  # the readable step, over the same weights
    assert reference.work == result.work and reference.num_ops > 1.5 * result.num_ops


def test_without_probes_the_bound_reads_a_buffer_of_the_step_s_size_by_the_step_s_clock(monkeypatch):
    asked = {}

    def bandwidth(num_bytes, device, threads):
        asked["bandwidth"] = (num_bytes, device.type, threads)
        return Bandwidth("cpu", num_bytes=10**9, timing=_timing(0.1), threads=threads)

    def compute(device, threads):
        asked["compute"] = (device.type, threads)
        return Compute("cpu", size=1000, dtype="float32", timing=_timing(0.02), threads=threads)

    monkeypatch.setattr(step_roofline, "step_bandwidth", bandwidth)
    monkeypatch.setattr(step_roofline, "matmul_probe", compute)
    result = measure_decode_step(TinyLlama(CONFIG).eval(), torch.zeros(2, 3, dtype=torch.long), 4, 1)
    assert asked == {"bandwidth": (result.work.num_bytes, "cpu", 1), "compute": ("cpu", 1)}


def test_step_bandwidth_sums_that_many_bytes_on_the_step_s_thread_by_its_cpu_time(monkeypatch):
    asked = {}

    def probe(num_bytes, device, repeats, threads, clock):
        asked.update(num_bytes=num_bytes, threads=threads, clock=clock, repeats=repeats)
        return "probe"

    monkeypatch.setattr(step_roofline, "memory_bandwidth", probe)
    assert step_roofline.step_bandwidth(1_000_001, "cpu", threads=1) == "probe"
    assert asked == {"num_bytes": 1_000_004, "threads": 1, "clock": "thread", "repeats": 7}  # whole floats
    step_roofline.step_bandwidth(10, "cpu", threads=None)
    assert asked["num_bytes"] == 4096 and asked["clock"] == "wall"  # the probe's least buffer; all threads
    with pytest.raises(KVLibError, match="positive"):
        step_roofline.step_bandwidth(0, "cpu")


def test_matmul_probe_times_the_product_by_the_thread_s_cpu_time(monkeypatch):
    clocks = []
    real_time_it = step_roofline.time_it

    def spy(fn, *args, **kwargs):
        clocks.append(kwargs["clock"])
        return real_time_it(fn, *args, **kwargs)

    monkeypatch.setattr(step_roofline, "time_it", spy)
    probe = step_roofline.matmul_probe("cpu", threads=1, repeats=2, size=32)
    assert clocks == ["thread"] and probe.size == 32 and probe.threads == 1 and probe.flops == 2 * 32**3
    assert probe.best_gflops > 0 and len(probe.timing.samples) == 2
    with pytest.raises(KVLibError, match="at least 16"):
        step_roofline.matmul_probe("cpu", size=8)


def test_lean_decode_step_dispatches_few_operators_and_allocates_nothing():
    """A decode step of a 2-layer model dispatches 69 aten operators by the lean pass on the fast
    cache (torch 2.13: 25 per layer, 19 for the rest; a few more are allowed for other versions),
    and more than 1.5 times as many through the readable model and cache. The lean step's operators
    write into buffers made by the first step of its shape (the first decode step, untimed), so
    from the second on none allocates where the numba kernel attends; the readable step's do."""
    model = LeanLlama(CONFIG).eval()
    decoder = Decoder(model, torch.zeros(2, 1, dtype=torch.long), 4)
    decoder.step()  # the prefill (here one token per sequence: the decode step's shape)
    num_ops, num_allocating = count_step_ops(decoder.step)
    assert num_ops <= 75
    if numba_module() is not None:
        assert num_allocating == 0
    readable = Decoder(TinyLlama.sharing(model), torch.zeros(2, 1, dtype=torch.long), 4)
    readable.step()
    reference_ops, reference_allocating = count_step_ops(readable.step)
    assert reference_ops > 1.5 * num_ops and reference_allocating > 0  # the counter sees allocations


def test_a_cache_that_keeps_what_it_is_handed_gets_fresh_tensors():
    """The concatenating cache keeps the k, v it is handed (no ``reuses_buffers``): the lean model must
    not hand it views of buffers the next layer overwrites (it runs its modules; its logits equal the
    fast cache's)."""
    model = LeanLlama(CONFIG).eval()
    prompt = torch.arange(6).view(2, 3) % CONFIG.vocab_size
    kept = generate(model, prompt, 5, "concat")
    written = generate(model, prompt, 5, "cache")
    assert torch.equal(kept.tokens, written.tokens)
    for a, b in zip(kept.step_logits, written.step_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
