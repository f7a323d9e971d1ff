"""Latency metrics of a run (kvlib.serving.latency, RunResult.ttft_s / tpot_s): TTFT, TPOT and ITL, their
percentiles and goodput, on runs built by hand (the arithmetic written out) and on simulated runs."""

import math

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.serving.latency import Goodput, goodput, inter_token_latencies, latency_summary
from kvlib.serving.results import RunResult
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import Request
from kvlib.serving.types import SeqState


def seq(req_id, arrival, output_len, first, finish):
    request = Request(req_id, arrival, (1, 2, 3), output_len)
    return SeqState(request, [1, 2, 3], num_generated=output_len, first_token_s=first, finish_s=finish)


def hand_run(seqs=None):
    """Four requests (arrival, output tokens, first token, last token):
    0: 0.0, 5, 0.50, 2.50  -> TTFT 0.50, TPOT (2.50 - 0.50) / 4 = 0.50, normalised 2.50 / 5 = 0.50
    1: 1.0, 3, 1.25, 1.75  -> TTFT 0.25, TPOT (1.75 - 1.25) / 2 = 0.25, normalised 0.75 / 3 = 0.25
    2: 2.0, 1, 3.00, 3.00  -> TTFT 1.00, no TPOT (one token),          normalised 1.00 / 1 = 1.00
    3: 2.0, 2, 2.50, 4.00  -> TTFT 0.50, TPOT (4.00 - 2.50) / 1 = 1.50, normalised 2.00 / 2 = 1.00
    Two steps, starting at 0.0 and 3.5, of 0.5 s each: the makespan is 3.5 + 0.5 - 0.0 = 4.0 s. The steps'
    counts (3 then 2 sequences, 1 prefill then none) give ITL 3 gaps of 0.5 s: this hand-made run's
    tokens are not those of its steps, so its ITL is only arithmetic on the steps."""
    if seqs is None:
        seqs = [
            seq(0, 0.0, 5, 0.5, 2.5),
            seq(1, 1.0, 3, 1.25, 1.75),
            seq(2, 2.0, 1, 3.0, 3.0),
            seq(3, 2.0, 2, 2.5, 4.0),
        ]
    steps = {
        "start_s": np.array([0.0, 3.5]),
        "duration_s": np.array([0.5, 0.5]),
        "num_seqs": np.array([3.0, 2.0]),
        "num_prefills": np.array([1.0, 0.0]),
    }
    return RunResult("paged", 64, seqs, steps, 0)


def test_ttft_and_tpot_per_request_by_hand():
    run = hand_run()
    assert run.ttft_s.tolist() == [0.5, 0.25, 1.0, 0.5]
    tpot = run.tpot_s
    assert tpot[[0, 1, 3]].tolist() == [0.5, 0.25, 1.5] and math.isnan(tpot[2])


def test_latency_summary_by_hand_with_linear_percentiles():
    s = latency_summary(hand_run())
    assert (s.num_requests, s.num_tpot_requests) == (4, 3)
    # TTFT sorted: 0.25, 0.5, 0.5, 1.0; mean 2.25 / 4
    assert s.ttft_mean_s == pytest.approx(0.5625)
    # linear: p50 at position 0.5 x 3 = 1.5, between 0.5 and 0.5; p99 at 0.99 x 3 = 2.97: 0.5 + 0.97 x 0.5
    assert s.ttft_p50_s == pytest.approx(0.5) and s.ttft_p99_s == pytest.approx(0.985)
    # TPOT sorted: 0.25, 0.5, 1.5 (request 2 has none); mean 2.25 / 3
    assert s.tpot_mean_s == pytest.approx(0.75)
    # p50 at position 1: 0.5; p99 at 0.99 x 2 = 1.98: 0.5 + 0.98 x (1.5 - 0.5)
    assert s.tpot_p50_s == pytest.approx(0.5) and s.tpot_p99_s == pytest.approx(1.48)
    # the paper's normalised latency: (0.5 + 0.25 + 1.0 + 1.0) / 4
    assert s.normalized_latency_s == pytest.approx(0.6875)
    # ITL: 2 + 2 decodes of 0.5 s steps
    assert (s.num_itl_gaps, s.itl_mean_s, s.itl_p50_s, s.itl_p99_s) == (4, 0.5, 0.5, 0.5)


def test_a_run_of_one_token_requests_has_no_tpot():
    s = latency_summary(hand_run([seq(0, 0.0, 1, 0.5, 0.5), seq(1, 1.0, 1, 2.0, 2.0)]))
    assert s.num_tpot_requests == 0 and math.isnan(s.tpot_p50_s) and math.isnan(s.tpot_p99_s)
    assert s.ttft_p50_s == pytest.approx(0.75)  # (0.5 + 1.0) / 2


def test_itl_counts_every_gap_over_all_requests_while_tpot_averages_per_request():
    # one step = 1 s + 0.5 s per sequence. Step 1 prefills both requests (2.0 s: first tokens at 2.0),
    # step 2 decodes both (2.0 s: tokens at 4.0; request 1, of 2 tokens, is done), step 3 decodes
    # request 0 alone (1.5 s: its last token at 5.5)
    requests = [Request(0, 0.0, (1, 2), 3), Request(1, 0.0, (3, 4), 2)]
    run = simulate(requests, "paged", 64, StepTimeModel(1.0, 0.5, 0.0, 0.0), 64)
    assert inter_token_latencies(run).tolist() == [2.0, 2.0, 1.5]
    s = latency_summary(run)
    # TPOT per request: (5.5 - 2.0) / 2 = 1.75 and (4.0 - 2.0) / 1 = 2.0; p50 of the two: 1.875
    assert run.tpot_s.tolist() == [1.75, 2.0] and s.tpot_p50_s == pytest.approx(1.875)
    # ITL over the 3 gaps: 2.0, 2.0 (request 0's first, request 1's only) and 1.5; mean 5.5 / 3, median 2.0
    assert s.num_itl_gaps == 3 and s.itl_mean_s == pytest.approx(5.5 / 3)
    assert (s.itl_p50_s, s.itl_p99_s) == (2.0, 2.0)


def test_itl_leaves_out_the_wait_of_a_preempted_request_one_gap_per_preemption():
    # 4 blocks of 4 slots for 3 requests that each grow to 12 tokens: paging preempts; each request's
    # first token and each recomputation's token follow no recorded gap
    requests = [Request(i, 0.0, (1, 2, 3, 4), 8) for i in range(3)]
    run = simulate(requests, "paged", 16, StepTimeModel(1.0, 0.0, 0.0, 0.0), 12, block_size=4, watermark=0.0)
    assert run.num_preemptions > 0
    s = latency_summary(run)
    assert s.num_itl_gaps == sum(r.output_len - 1 for r in requests) - run.num_preemptions
    assert s.itl_p99_s == 1.0  # every recorded gap is one step of 1 s
    assert s.tpot_p99_s > 1.0  # the preempted request's TPOT counts its wait


def test_a_run_without_decodes_has_no_itl():
    run = hand_run([seq(0, 0.0, 1, 0.5, 0.5), seq(1, 1.0, 1, 2.0, 2.0)])  # one token each
    run.steps["num_seqs"], run.steps["num_prefills"] = np.array([1.0, 1.0]), np.array([1.0, 1.0])
    s = latency_summary(run)
    assert s.num_itl_gaps == 0 and math.isnan(s.itl_mean_s) and math.isnan(s.itl_p99_s)


def test_goodput_needs_both_targets_by_hand():
    run = hand_run()
    # TTFT <= 0.5 and TPOT <= 0.5: requests 0 (0.5, 0.5) and 1 (0.25, 0.25); 2 is late (1.0),
    # 3 too slow after its first token (1.5)
    g = goodput(run, 0.5, 0.5)
    assert g == Goodput(0.5, 0.5, 2, 4, 4.0)
    assert g.share == 0.5 and g.requests_per_s == 2 / 4.0
    # TTFT <= 1.0: request 2 now counts (one token: its TPOT counts as 0, as in vLLM); 3 still too slow
    assert goodput(run, 1.0, 0.5).num_good == 3
    # no TPOT target: every request meets TTFT <= 1.0
    assert goodput(run, 1.0, math.inf).num_good == 4
    # TPOT <= 0.25 only leaves request 1 (and 2, which has no gap) but 2's TTFT is 1.0 > 0.5
    assert goodput(run, 0.5, 0.25).num_good == 1


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, "1", True, None])
def test_goodput_refuses_bad_targets(bad):
    with pytest.raises(KVLibError, match="ttft_slo_s"):
        goodput(hand_run(), bad, 1.0)
    with pytest.raises(KVLibError, match="tpot_slo_s"):
        goodput(hand_run(), 1.0, bad)


def test_empty_or_unfinished_runs_and_strangers_are_refused():
    with pytest.raises(KVLibError, match="no finished requests"):
        latency_summary(hand_run([]))
    with pytest.raises(KVLibError, match="no finished requests"):
        goodput(hand_run([]), 1.0, 1.0)
    with pytest.raises(KVLibError, match="RunResult"):
        latency_summary([1.0, 2.0])
    with pytest.raises(KVLibError, match="request 0 has no first_token_s"):
        latency_summary(hand_run([seq(0, 0.0, 3, None, None)]))


def test_a_simulated_request_alone_has_one_step_per_token():
    # one step = 1 s whatever it computes: the prefill step (ending at 1 s) gives the first token,
    # then one step per token: the 6th token ends at 6 s. TTFT 1, TPOT (6 - 1) / 5 = 1, normalised 6 / 6
    run = simulate([Request(0, 0.0, (1, 2, 3, 4), 6)], "paged", 64, StepTimeModel(1.0, 0.0, 0.0, 0.0), 64)
    s = latency_summary(run)
    assert (s.ttft_p99_s, s.tpot_p99_s, s.normalized_latency_s) == (1.0, 1.0, 1.0)
