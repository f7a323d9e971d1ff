"""Chapter 4's experiment helpers (kvlib.chapters.ch04_serving.policy_comparison, kvlib.serving.roofline): the
paper's KV budget, the A100 roofline step, step-time regimes and throughput ratios."""

import math

import numpy as np
import pytest

from kvlib import KVLibError, gpus
from kvlib.chapters.ch04_serving import policy_comparison as sm
from kvlib.serving import roofline as gm
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import SHAREGPT, make_trace
from kvlib.units import GiB

UNIT = StepTimeModel(1.0, 0.0, 0.0, 0.0)


def test_opt_13b_on_an_a100_leaves_987_blocks_of_16():
    budget = gm.kv_budget("OPT-13B")
    assert budget.bytes_per_token == 819_200 and budget.weight_bytes == 2 * 12_853_473_280
    assert budget.kv_bytes == int(0.9 * 40 * GiB) - budget.weight_bytes
    assert budget.num_blocks == budget.kv_bytes // (819_200 * 16) == 987
    assert budget.num_slots // 2048 == 7
    with pytest.raises(KVLibError, match="no room"):
        gm.kv_budget("Llama-2-70B")


def test_the_roofline_step_reads_weights_and_cache_and_computes_each_token_at_the_a100s_peaks():
    step = gm.roofline_step_model("OPT-13B")
    assert step.fixed_s == pytest.approx(2 * 12_853_473_280 / 1.555e12)  # 25.7 GB of fp16 weights: 16.53 ms
    assert step.per_seq_s == pytest.approx(
        2 * 12_853_473_280 / 312e12
    )  # 2 FLOPs per parameter per token: 82.4 µs
    assert step.per_context_s == pytest.approx(819_200 / 1.555e12)  # 0.527 µs per cached token
    assert step.per_prefill_s == step.per_seq_s
    # paged's operating point in chapter 4: the memory part (16.53 + 15,000 x 0.000527 ms) outweighs the
    # compute part (30 x 0.0824 ms), so the step is the memory part: 16.53 / 24.43
    assert step.overlapped
    assert step.fixed_share(30, 15_000) == pytest.approx(16.532 / (16.532 + 7.902), abs=1e-3)
    summed = gm.roofline_step_model("OPT-13B", overlapped=False)  # chapter 8's contrast: the sum
    assert summed.fixed_share(30, 15_000) == pytest.approx(16.532 / (16.532 + 2.472 + 7.902), abs=1e-3)


def test_the_roofline_adds_the_state_per_sequence_to_the_memory_part_and_names_bad_input():
    plain = gm.roofline_step(1_000_000_000, 1000)
    with_state = gm.roofline_step(1_000_000_000, 1000, state_bytes=1_555_000)
    assert with_state.per_seq_memory_s - plain.per_seq_memory_s == pytest.approx(
        2 * 1_555_000 / 1.555e12
    )  # read + write: 2 µs
    assert (with_state.fixed_s, with_state.per_context_s, with_state.per_seq_s) == (
        plain.fixed_s,
        plain.per_context_s,
        plain.per_seq_s,
    )
    # a memory-bound step: 8 sequences of 1,000 cached tokens and their states take the memory part
    memory = plain.fixed_s + 8 * 1000 * plain.per_context_s + 8 * 2 * 1_555_000 / 1.555e12
    assert with_state.predict(8, 8000, 0) == pytest.approx(memory)
    gpu = gpus.GPU("half an A100", gpus.A100_BYTES, gpus.A100_BANDWIDTH / 2, gpus.A100_FP16_FLOPS / 2)
    slow = gm.roofline_step(1_000_000_000, 1000, gpu=gpu)
    for term in ("fixed_s", "per_seq_s", "per_context_s", "per_prefill_s"):
        assert getattr(slow, term) == pytest.approx(2 * getattr(plain, term))
    with pytest.raises(KVLibError, match="state_bytes"):
        gm.roofline_step(1_000_000_000, 1000, state_bytes=-1)
    with pytest.raises(KVLibError, match="bytes_per_token"):
        gm.roofline_step(1_000_000_000, 0)


def test_with_fixed_share_scales_only_the_batch_dependent_costs():
    step = StepTimeModel(0.004, 3e-5, 2e-7, 5e-5)
    for share in (0.2, 0.5, 0.9):
        scaled = sm.with_fixed_share(step, share, 30, 15_000)
        assert scaled.fixed_share(30, 15_000) == pytest.approx(share)
        assert (scaled.fixed_s, scaled.per_prefill_s) == (step.fixed_s, step.per_prefill_s)
    flat = sm.with_fixed_share(step, 1.0, 30, 15_000)
    assert flat.per_seq_s == flat.per_context_s == 0
    with pytest.raises(KVLibError, match="fixed share"):
        sm.with_fixed_share(step, 0.0, 30, 15_000)
    with pytest.raises(KVLibError, match="summed step model"):
        sm.with_fixed_share(gm.roofline_step_model(), 0.5, 30, 15_000)


@pytest.fixture(scope="module")
def runs():
    requests = make_trace(SHAREGPT, 150, math.inf, seed=0)
    return sm.serve_policies(requests, gm.kv_budget().num_slots, UNIT, SHAREGPT.max_len, progress=False)


def test_memory_table_and_ratios(runs):
    rows = {r["policy"]: r for r in sm.memory_table(runs)}
    assert set(rows) == {"max", "pow2", "oracle", "paged"}
    for row in rows.values():
        assert sum(
            row[f"{c} (%)"] for c in ("tokens", "reserved", "internal", "external", "free")
        ) == pytest.approx(100)
    assert rows["paged"]["paper: tokens (%)"] == 96.3
    flat = sm.ratios(runs)  # one time unit per step: throughput follows tokens per step
    assert flat["max"] > flat["pow2"] > 1 and flat["oracle"] > 1


def test_the_flatter_the_step_the_larger_the_gain(runs):
    curve = sm.regime_curve(runs, StepTimeModel(0.004, 3e-5, 3e-7, 3e-5), [0.2, 0.5, 0.8, 1.0])
    for policy in ("max", "pow2", "oracle"):
        values = [row[f"paged / {policy}"] for row in curve]
        assert values == sorted(values) and values[0] < values[-1]
    n, ctx = sm.operating_point(runs["paged"])
    assert n > 1 and ctx > 1000


def test_busy_totals_sum_the_steps_while_requests_wait(runs):
    run = runs["oracle"]
    busy = run.steps["num_waiting"] > 0
    totals = sm.busy_totals(run)
    assert totals["steps"] == busy.sum() and totals["prefill"] == run.steps["prefill_tokens"][busy].sum()
    assert totals["tokens"] == totals["seqs"]  # no chunked prefill: every sequence computed gets a token
    # a summed step model's busy time is the totals weighted by its constants
    step = StepTimeModel(0.004, 3e-5, 2e-7, 5e-5)
    busy_s = float(run.retimed(step).steps["duration_s"][busy].sum())
    weighted = (
        0.004 * totals["steps"] + 3e-5 * totals["seqs"] + 2e-7 * totals["context"] + 5e-5 * totals["prefill"]
    )
    assert busy_s == pytest.approx(weighted)


def test_below_the_prefill_limit_paged_leads_whatever_the_other_costs(runs):
    rng = np.random.default_rng(0)
    for policy in ("max", "pow2", "oracle"):
        limit = sm.prefill_limit(runs, policy)
        assert 0 < limit < math.inf
        # just below the limit paged leads for any costs per sequence and per cached token ...
        for _ in range(20):
            step = StepTimeModel(1e-3, *(rng.uniform(0, 1e-4), rng.uniform(0, 1e-6)), 0.999 * limit * 1e-3)
            assert sm.ratios(runs, step)[policy] > 1, (policy, step)
        # ... and just above it, with those costs zero (a flat decode step), it falls behind
        assert sm.ratios(runs, StepTimeModel(1e-3, 0.0, 0.0, 1.001 * limit * 1e-3))[policy] < 1


def test_the_prefill_limit_needs_steps_that_favour_paged(runs):
    with pytest.raises(KVLibError, match="no bound on the prompt cost alone"):
        sm.prefill_limit({"paged": runs["max"], "max": runs["paged"]}, "max")  # the roles swapped


def test_share_needed_interpolates_on_the_curve():
    curve = [{"fixed share": s, "paged / max": r} for s, r in ((0.2, 1.5), (0.6, 2.5), (1.0, 3.0))]
    assert sm.share_needed(curve, "max", 2.0) == pytest.approx(0.4)
    assert sm.share_needed(curve, "max", 1.2) == 0.2  # reached at the first point already
    assert sm.share_needed(curve, "max", 3.0) == pytest.approx(1.0)
    assert sm.share_needed(curve, "max", 3.5) is None


def test_a_higher_watermark_preempts_less_and_holds_fewer_tokens(runs):
    requests = make_trace(SHAREGPT, 150, math.inf, seed=0)
    rows = sm.watermark_sweep(
        requests,
        gm.kv_budget().num_slots,
        SHAREGPT.max_len,
        [0.0, 0.01, 0.1],
        runs,
        StepTimeModel(0.004, 3e-5, 3e-7, 3e-5),
        progress=False,
    )
    assert [r["watermark (%)"] for r in rows] == [0, 1, 10]
    assert rows[0]["preemptions"] >= rows[1]["preemptions"] > rows[2]["preemptions"]
    assert rows[0]["tokens (%)"] > rows[2]["tokens (%)"]
    assert all(r["prefilled / prompt tokens"] >= 1 and r["paged / max"] > 1 for r in rows)
    with pytest.raises(KVLibError, match="watermark"):
        sm.watermark_sweep(requests, 4096, SHAREGPT.max_len, [1.0], runs, UNIT, progress=False)


def test_preemption_costs_count_what_recomputation_prefills_again(runs):
    requests = make_trace(SHAREGPT, 150, math.inf, seed=0)
    paged = runs["paged"]
    costs = sm.preemption_costs(paged, requests)
    assert costs["preemptions"] == paged.num_preemptions == len(paged.preempted_generated) > 0
    # without prefix caching every request is prefilled once, and again (prompt + generated) per preemption
    prompts = sum(r.prompt_len for r in requests)
    assert costs["tokens recomputed"] == paged.steps["prefill_tokens"].sum() - prompts
    generated_share = paged.preempted_generated.sum() / costs["tokens recomputed"]
    assert costs["generated share of the recomputed"] == pytest.approx(generated_share)
    assert 0 < costs["generated share of the recomputed"] < 1
    assert costs["generated before preemption: 25%"] <= costs["median"] <= costs["75%"] <= costs["largest"]
    with pytest.raises(KVLibError, match="no preemptions"):
        sm.preemption_costs(runs["max"], requests)


def test_cap_table_finds_the_steps_where_the_cap_binds(runs):
    (row,) = sm.cap_table({"ShareGPT-like": runs["paged"]}, max_num_seqs=runs["paged"].largest_batch)
    assert (
        row["largest batch"] == runs["paged"].largest_batch
        and row[f"steps at the cap of {row['largest batch']} (%)"] > 0
    )
    (never,) = sm.cap_table({"ShareGPT-like": runs["paged"]}, max_num_seqs=10_000)
    assert never["steps at the cap of 10000 (%)"] == 0 and never["budget free at the cap (%)"] == 0
    share, free_at_cap, free_else = runs["paged"].at_cap(10_000)
    assert share == 0 and free_else == pytest.approx(runs["paged"].memory_shares()["free"])


def test_paper_band_says_where_a_ratio_lies_in_both_languages():
    from kvlib.chapters.ch04_serving.policy_comparison import PAPER_RATE_VS_ORACLE, paper_band

    assert paper_band(2.0, PAPER_RATE_VS_ORACLE) == "inside the paper's band"
    assert paper_band(1.7, PAPER_RATE_VS_ORACLE) == "inside the paper's band"  # the band's ends are in it
    assert paper_band(1.2, PAPER_RATE_VS_ORACLE) == "below the paper's band"
    assert paper_band(3.0, PAPER_RATE_VS_ORACLE, ja=True) == "論文の範囲より上"
