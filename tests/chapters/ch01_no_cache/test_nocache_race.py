"""Tests of kvlib.chapters.ch01_no_cache.nocache_race: the lockstep race, sampled passes, setups, bench."""

import numpy as np
import pytest
import torch

import kvlib.chapters.ch01_no_cache.nocache_race as nocache
from kvlib import KVLibError
from kvlib.cache.contiguous import concat_bytes_copied, kv_bytes_per_token
from kvlib.chapters.ch01_no_cache.nocache_race import (
    Race,
    estimated_total_s,
    fastest_nearby,
    nocache_setup,
    race,
    time_passes,
)
from kvlib.measure.timing import torch_threads
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from tests.single_thread import one_torch_thread  # noqa: F401

TINY = ModelConfig(
    vocab_size=61, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48, max_seq_len=256
)


def test_race_runs_every_mode_to_the_same_tokens():
    model, prompt = TinyLlama(TINY).eval(), torch.tensor([[1], [2]])
    result = race(model, prompt, 20, modes=("none", "cache", "concat"))
    assert result.tokens_identical and result.num_new == 20
    assert result.tokens["none"].shape == (2, 21)
    assert all(result.step_s[m].shape == (20,) and np.all(result.step_s[m] > 0) for m in result.modes)
    assert result.max_logit_diff["none"] == 0.0 and result.max_logit_diff["concat"] < 1e-4
    assert result.min_gap > 0
    # Cache bytes are read off the tensors: the preallocated cache holds its reservation from
    # the start, the concatenating one grows by one token per step and has copied this much.
    assert set(result.cache_bytes["cache"]) == {2 * 21 * kv_bytes_per_token(TINY)}
    assert list(result.cache_bytes["concat"]) == [2 * (s + 1) * kv_bytes_per_token(TINY) for s in range(20)]
    assert result.bytes_copied["concat"][-1] == concat_bytes_copied(TINY, 20, batch_size=2)


def test_race_totals_and_speedups():
    result = Race(
        ("none", "cache"),
        {"none": np.array([1.0, 2.0, 3.0]), "cache": np.array([1.0, 1.0, 1.0])},
        {},
        {},
        1.0,
    )
    assert result.total_s("none", 2) == 3.0
    assert result.speedup(3) == 2.0
    assert (result.total_s("none", 3), result.total_s("cache", 3)) == (6.0, 3.0)
    with pytest.raises(KVLibError, match="between 1 and 3"):
        result.total_s("none", 4)


def test_race_rejects_unknown_or_repeated_modes():
    model = TinyLlama(TINY)
    with pytest.raises(KVLibError, match="modes"):
        race(model, torch.zeros(1, 1, dtype=torch.long), 3, modes=("none", "fast"))
    with pytest.raises(KVLibError, match="modes"):
        race(model, torch.zeros(1, 1, dtype=torch.long), 3, modes=("cache", "cache"))


def test_passes_are_timed_and_interpolated():
    model = TinyLlama(TINY).eval()
    seconds = time_passes(model, torch.zeros(1, 50, dtype=torch.long), [10, 50])
    assert seconds.shape == (2,) and np.all(seconds > 0)
    with pytest.raises(KVLibError, match="between 1 and 50"):
        time_passes(model, torch.zeros(1, 50, dtype=torch.long), [60])
    steps = np.array([1.0] * 10)  # 10 measured steps of 1 s, then passes timed at 20 (3 s) and 30 (5 s)
    assert estimated_total_s(steps, [20, 30], np.array([3.0, 5.0]), 10) == 10.0
    assert estimated_total_s(steps, [20, 30], np.array([3.0, 5.0]), 20) == pytest.approx(
        10 + sum(1 + 0.2 * i for i in range(1, 11))
    )
    with pytest.raises(KVLibError, match="reach 40"):
        estimated_total_s(steps, [20, 30], np.array([3.0, 5.0]), 40)


def test_steps_and_passes_are_timed_by_the_thread_s_cpu_time_on_one_thread(monkeypatch):
    seen = []

    def spy(fn, *args, **kwargs):
        seen.append((kwargs["clock"], kwargs["repeats"]))
        return real_time_it(fn, *args, **kwargs)

    real_time_it = nocache.time_it
    monkeypatch.setattr(nocache, "time_it", spy)
    model = TinyLlama(TINY).eval()
    race(model, torch.tensor([[1]]), 3, warmup=0)
    assert seen == [("thread", 1)] * 6  # two modes, three steps, each timed once
    seen.clear()
    time_passes(model, torch.zeros(1, 20, dtype=torch.long), [5, 20])
    assert seen == [("thread", 3)] * 2  # a pass changes nothing: the fastest of three
    with torch_threads(2):
        seen.clear()
        time_passes(model, torch.zeros(1, 20, dtype=torch.long), [5], repeats=2)
        assert seen == [("wall", 2)]  # two threads: the caller's CPU time would miss the second
    with pytest.raises(KVLibError, match="repeats"):
        time_passes(model, torch.zeros(1, 20, dtype=torch.long), [5], repeats=0)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_setups_are_consistent(device, monkeypatch):
    # a torch.device("cuda") can be named without a GPU; the facts a GPU setup reads are stubbed
    monkeypatch.setattr(nocache, "launch_overhead_s", lambda device: 5e-6)
    monkeypatch.setattr(nocache, "matmul_gflops", lambda device: type("C", (), {"best_gflops": 50_000.0})())
    setup = nocache_setup(device)
    assert setup.device.type == device
    assert setup.claim_length in setup.lengths and setup.claim_length <= setup.race_length
    assert (
        1.0 < setup.claim_speedup < 6.0
    )  # a sanity floor: above a cache that saves nothing, below the article's 6.0x
    assert setup.longest < setup.config.max_seq_len
    assert setup.hf_length <= setup.race_length
    assert all(n <= setup.race_length or n <= max(setup.pass_lengths) for n in setup.lengths)
    assert list(setup.pass_lengths) == sorted(setup.pass_lengths)


def test_gpu_batch_grows_with_launch_overhead_and_matmul_rate():
    from kvlib.chapters.ch01_no_cache.costmodel import forward_flops

    per_sequence = sum(forward_flops(nocache.GPU_CONFIG, 100, 100).values())  # 17.9 GFLOP at 100 tokens
    # 2,000 launches of 5 us at 50 TFLOP/s: 500 GFLOP of arithmetic, 28 sequences, rounded up to 32
    assert nocache.gpu_batch(nocache.GPU_CONFIG, 100, 5e-6, 5e13) == 32
    assert 16 * per_sequence < 2000 * 5e-6 * 5e13 <= 32 * per_sequence
    assert (
        nocache.gpu_batch(nocache.GPU_CONFIG, 100, 5e-6, 1e14) == 64
    )  # a faster GPU needs more work per pass
    assert nocache.gpu_batch(nocache.GPU_CONFIG, 100, 1e-9, 1e9) == 1
    assert nocache.gpu_batch(nocache.GPU_CONFIG, 100, 1.0, 1e15) == nocache.GPU_MAX_BATCH
    with pytest.raises(KVLibError, match="positive"):
        nocache.gpu_batch(nocache.GPU_CONFIG, 100, 0, 1e9)


def test_fastest_nearby_removes_bursts_of_load():
    seconds = np.array([1.0, 1.1, 9.0, 1.3, 1.4, 1.5, 8.0, 1.7])  # two steps hit by load
    assert fastest_nearby(seconds, 3).tolist() == [1.0, 1.0, 1.1, 1.3, 1.3, 1.4, 1.5, 1.7]
    assert fastest_nearby(seconds, 1).tolist() == seconds.tolist()
    with pytest.raises(KVLibError, match="odd"):
        fastest_nearby(seconds, 4)


def test_a_steady_race_keeps_its_tokens():
    result = Race(
        ("none", "cache"),
        {"none": np.array([1.0, 5.0, 3.0]), "cache": np.array([2.0, 1.0, 9.0])},
        {"none": torch.zeros(1, 4), "cache": torch.zeros(1, 4)},
        {},
        1.0,
    )
    steady = result.steady(3)
    assert steady.step_s["none"].tolist() == [1.0, 1.0, 3.0] and steady.step_s["cache"].tolist() == [
        1.0,
        1.0,
        1.0,
    ]
    assert steady.tokens is result.tokens and result.step_s["none"].tolist() == [1.0, 5.0, 3.0]


def test_cpu_setup_runs_on_one_thread():
    setup = nocache_setup("cpu")
    assert setup.threads == 1 and setup.batch == 1
    assert setup.prompt().tolist() == [[0]]
    with torch_threads(1):
        assert torch.get_num_threads() == 1


@pytest.mark.slow
def test_bench_reports_the_chapter_fields(monkeypatch):
    tiny = nocache.NoCacheSetup(
        torch.device("cpu"),
        TINY,
        batch=1,
        race_length=16,
        pass_lengths=(),
        lengths=(8, 16),
        claim_length=16,
        claim_speedup=3.0,
        hf_length=5,
        threads=1,
        tokens_must_match=True,
    )
    monkeypatch.setattr(nocache, "nocache_setup", lambda device=None: tiny)
    fields = nocache.bench(lengths=(8, 16))  # the CLI's bench() races 800 tokens of the chapter's model
    assert set(fields) == {"cache_speedup_8", "cache_speedup_16", "hf_tokens_per_s_ratio", "tokens_identical"}
    assert fields["tokens_identical"] is True
    assert fields["cache_speedup_16"] > 0 and fields["hf_tokens_per_s_ratio"] > 0


def test_bench_default_fields_are_the_issue_s():
    import inspect

    assert inspect.signature(nocache.bench).parameters["lengths"].default == (400, 800)
