"""The real engine (kvlib.serving.engine, kvlib.serving.calibration): kvlib.model served on the
paged cache under each policy, preemption by recomputation that never changes a request's
tokens, and the calibration."""

import math

import pytest
import torch

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.serving.calibration import calibrate, decode_lengths
from kvlib.serving.engine import engine_clock, outputs_match_solo, race_engine, run_engine, solo_tokens
from kvlib.serving.placement import POLICIES
from kvlib.serving.traces import TraceSpec, make_trace

MODEL = TinyLlama(
    ModelConfig(
        vocab_size=97, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64, max_seq_len=128
    )
)
SMALL = TraceSpec("small", 8, 16, max_len=64)


def test_a_tiny_budget_forces_many_preemptions_and_every_request_still_generates_its_solo_tokens():
    requests = make_trace(TraceSpec("stress", 12, 24, max_len=64), 12, math.inf, seed=3, vocab_size=97)
    result = run_engine(
        MODEL, requests, "paged", 64, 64, block_size=4, progress=False
    )  # 16 blocks of 4 tokens
    assert result.num_preemptions >= 8
    assert sum(s.num_preemptions > 0 for s in result.finished) >= 3
    assert len(result.finished) == 12
    assert outputs_match_solo(MODEL, result)


def test_every_policy_generates_the_same_tokens_at_the_same_budget():
    requests = make_trace(SMALL, 16, math.inf, seed=4, vocab_size=97)
    results = {p: run_engine(MODEL, requests, p, 256, 64, progress=False) for p in POLICIES}
    outputs = {p: [s.generated for s in r.finished] for p, r in results.items()}
    assert all(outputs[p] == outputs["paged"] for p in POLICIES)
    assert outputs["paged"][:4] == [solo_tokens(MODEL, r) for r in requests[:4]]
    assert (
        results["max"].largest_batch == 4 and results["paged"].largest_batch > 4
    )  # 256 slots hold 4 reservations of 64
    assert all(results[p].num_preemptions == 0 for p in ("max", "pow2", "oracle"))


def test_race_engine_times_each_step_by_its_fastest_run_of_the_same_schedule():
    requests = make_trace(SMALL, 8, math.inf, seed=4, vocab_size=97)
    best = race_engine(MODEL, requests, ("max", "paged"), 256, 64, rounds=2, progress=False)
    assert set(best) == {"max", "paged"}
    again = run_engine(MODEL, requests, "paged", 256, 64, progress=False)
    assert [s.generated for s in best["paged"].finished] == [s.generated for s in again.finished]
    assert len(best["paged"].steps["duration_s"]) == len(
        again.steps["duration_s"]
    )  # the same steps, another clock
    steps = best["paged"].steps
    assert best["paged"].makespan_s == pytest.approx(steps["duration_s"].sum())  # back to back
    assert all(s.finish_s <= best["paged"].makespan_s + 1e-12 for s in best["paged"].finished)
    with pytest.raises(KVLibError, match="rounds"):
        race_engine(MODEL, requests, ("paged",), 256, 64, rounds=0, progress=False)
    with pytest.raises(KVLibError, match="queued at time 0"):
        race_engine(
            MODEL,
            make_trace(SMALL, 3, rate=200.0, seed=5, vocab_size=97),
            ("paged",),
            256,
            64,
            progress=False,
        )


def test_with_durations_moves_every_token_to_the_end_of_its_step():
    requests = make_trace(SMALL, 6, math.inf, seed=4, vocab_size=97)
    run = run_engine(MODEL, requests, "paged", 256, 64, progress=False)
    n = len(run.steps["duration_s"])
    timed = run.with_durations([0.5] * n)  # every step half a second
    assert timed.makespan_s == pytest.approx(0.5 * n)
    step_ends = list(run.steps["start_s"] + run.steps["duration_s"])
    last_step = [step_ends.index(s.finish_s) for s in run.finished]  # a request finishes at the end of a step
    assert [s.finish_s for s in timed.finished] == pytest.approx([0.5 * (i + 1) for i in last_step])
    with pytest.raises(KVLibError, match="durations"):
        run.with_durations([0.5] * (n + 1))


def test_requests_arriving_later_are_waited_for():
    requests = make_trace(SMALL, 3, rate=200.0, seed=5, vocab_size=97)
    result = run_engine(MODEL, requests, "paged", 256, 64, progress=False)
    assert all(s.first_token_s >= s.request.arrival_s for s in result.finished)
    assert outputs_match_solo(MODEL, result)


def test_the_engine_refuses_requests_longer_than_max_len():
    requests = make_trace(TraceSpec("long", 40, 40, max_len=128), 3, math.inf, seed=0, vocab_size=97)
    with pytest.raises(KVLibError, match="longer than max_len"):
        run_engine(MODEL, requests, "paged", 512, 32, progress=False)


@pytest.mark.slow
def test_calibration_measures_every_point_and_fits_nonnegative_constants():
    calibration = calibrate(
        MODEL,
        decode_points=((1, 8), (4, 8), (4, 128), (16, 64)),
        prefill_lengths=(8, 32),
        repeats=1,
        rounds=1,
        progress=False,
    )
    assert [r["kind"] for r in calibration.rows] == ["decode"] * 4 + ["prefill"] * 2
    # the lengths of a point differ by less than a block of 16: 8, 7, 6, 5 for (4, 8)
    assert [r["context_tokens"] for r in calibration.rows[:4]] == [
        8,
        8 + 7 + 6 + 5,
        128 + 127 + 126 + 125,
        sum(range(49, 65)),
    ]
    assert all(r["seconds"] > 0 and r["fitted_s"] > 0 for r in calibration.rows)
    assert calibration.model.fixed_s > 0  # a forward pass of a tiny model costs something whatever its batch


@pytest.mark.slow
def test_calibration_recovers_the_costs_of_steps_timed_by_a_known_model(monkeypatch):
    """With the timers replaced by a known step model, the fit must return that model: this catches
    a point measured with the wrong lengths, columns passed in the wrong order, or a broken fit
    (the clamped constants are >= 0 by construction, so only their values can show a regression)."""
    import kvlib.serving.calibration as engine
    from kvlib.serving.step_time import StepTimeModel

    truth = StepTimeModel(1e-3, 2e-5, 3e-8, 4e-6)
    monkeypatch.setattr(
        engine,
        "_decode_step_s",
        lambda model, n, length, block_size, repeats: float(
            truth.predict(n, sum(decode_lengths(n, length, block_size)), 0)
        ),
    )
    monkeypatch.setattr(
        engine, "_prefill_s", lambda model, length, block_size, repeats: float(truth.predict(1, 0, length))
    )
    fitted = calibrate(
        MODEL,
        decode_points=((1, 8), (4, 8), (4, 128), (16, 64)),
        prefill_lengths=(8, 32),
        repeats=1,
        rounds=2,
        progress=False,
    ).model
    for term in ("fixed_s", "per_seq_s", "per_context_s", "per_prefill_s"):
        assert getattr(fitted, term) == pytest.approx(getattr(truth, term), rel=1e-6), term


def test_calibration_lengths_differ_by_less_than_a_block():
    assert decode_lengths(3, 2, 16) == [2, 1, 2]
    lengths = decode_lengths(40, 100, 16)
    assert max(lengths) == 100 and min(lengths) == 85 and len(set(lengths)) == 16


def test_steps_are_also_read_on_the_thread_clock():
    requests = make_trace(SMALL, 4, math.inf, seed=4, vocab_size=97)
    run = run_engine(MODEL, requests, "paged", 256, 64, progress=False, clock="thread")
    wall, cpu = run.steps["duration_s"], run.steps["clock_s"]
    assert len(cpu) == len(wall) and (cpu > 0).all()
    # one thread cannot use more CPU time than the wall-clock time that passed around it
    assert (cpu <= wall + 1e-4).all()
    assert engine_clock(torch.device("cpu")) == "thread"


def test_the_stress_test_with_chunked_prefill_swapping_and_speculative_decoding_on():
    """Every request's tokens equal its solo run with chapter 8's three features at once."""
    from kvlib.serving.scheduler import SchedulerConfig

    draft = TinyLlama(
        ModelConfig(
            vocab_size=97, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32, max_seq_len=128
        )
    )
    requests = make_trace(TraceSpec("stress", 12, 24, max_len=64), 12, math.inf, seed=3, vocab_size=97)
    config = SchedulerConfig(
        max_num_seqs=4,
        enable_chunked_prefill=True,
        max_num_batched_tokens=6,
        preemption_mode="swap",
        num_host_blocks=6,
    )
    # one budget for both caches: 80 target slots of 256 bytes (2 layers x 2 x 2 heads x 8 x 4 bytes)
    # = 20,480 bytes; a block pair costs 4 x (256 + 64) = 1,280 bytes, so 16 pairs: 64 target slots
    result = run_engine(
        MODEL,
        requests,
        "paged",
        80,
        64,
        block_size=4,
        config=config,
        progress=False,
        draft=draft,
        num_speculative_tokens=3,
    )
    assert result.num_slots == 64
    assert sum(s.num_swaps for s in result.finished) >= 3  # swapped out and back in
    assert (result.steps["new_tokens"] < result.steps["num_seqs"]).any()  # partial prefills ran
    assert result.steps["prefill_tokens"].max() <= 6
    assert (result.steps["new_tokens"] > result.steps["num_seqs"]).any()  # some guesses were accepted
    assert len(result.finished) == 12
    assert outputs_match_solo(MODEL, result)
    with pytest.raises(KVLibError, match="needs a draft"):
        run_engine(MODEL, requests, "paged", 64, 64, block_size=4, progress=False, num_speculative_tokens=2)


def test_the_draft_cache_comes_out_of_the_same_budget():
    from kvlib.cache.contiguous import kv_bytes_per_token
    from kvlib.serving.speculative_engine import target_share

    draft = TinyLlama(
        ModelConfig(
            vocab_size=97, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=32, max_seq_len=128
        )
    )
    # target: 2 layers x K and V x 2 heads x head_dim 8 x 4 bytes = 256; draft: 1 x 2 x 2 x 8 x 4 = 128
    assert (kv_bytes_per_token(MODEL.config), kv_bytes_per_token(draft.config)) == (256, 128)
    # 100 slots x 256 = 25,600 bytes; a pair of 16-token blocks costs 16 x 384 = 6,144: 4 pairs, 64 slots
    assert target_share(MODEL, draft, 100, 16) == 64
    with pytest.raises(KVLibError, match="draft must be a TinyLlama"):
        target_share(MODEL, "small", 100, 16)
