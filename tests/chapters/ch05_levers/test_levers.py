"""Chapter 5's lever chain (kvlib.chapters.ch05_levers.levers): exact factors, the hybrid variant, the KV
budget,
capacity and roofline generalised from chapter 4, and the simulated server."""

from dataclasses import replace
from fractions import Fraction

import matplotlib
import pytest

from kvlib import KVLibError, gpus
from kvlib.chapters.ch05_levers import levers as lv
from kvlib.plotting.levers import draw_chain
from kvlib.serving import roofline as gm
from kvlib.sizing.capacity import max_batch, weight_bytes
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import bytes_per_token
from kvlib.units import GiB

matplotlib.use("Agg")

SMALL_GPU = gpus.GPU("17 GiB test GPU", 17 * GiB, 1e12, 1e14)  # leaves ~3 GB beside Llama-2-7B's weights


@pytest.mark.parametrize("model", ["Llama-2-7B", "Llama-3-8B", "OPT-13B"])
def test_bytes_per_token_is_the_baseline_times_the_product_of_the_factors(model):
    chain = lv.lever_chain(model)
    base = chain[0].bytes_per_token
    for variant, total in zip(chain, lv.cumulative_factors(chain), strict=True):
        assert variant.bytes_per_token == base * total  # exact: Fraction == int
    assert [v.lever for v in chain[1:]] == list(lv.LEVERS)


def test_llama_2_7b_chain_factors_and_flags():
    chain = lv.lever_chain("Llama-2-7B")
    assert [v.factor for v in chain] == [1, Fraction(1, 4), Fraction(1, 2), Fraction(1, 8), 1, 1]
    assert [v.bytes_per_token for v in chain] == [524_288, 131_072, 65_536, 8_192, 8_192, 8_192]
    assert [v.hypothetical for v in chain] == [False] + [
        True
    ] * 5  # every variant after GQA-8 is a model nobody trained
    assert [v.policy for v in chain] == ["max"] * 4 + ["paged"] * 2
    assert [v.prefix_caching for v in chain] == [False] * 5 + [True]


def test_quantized_factors_include_the_scales():
    base = lv.base_variant("Llama-2-7B")
    assert lv.apply_lever(base, "lower precision", dtype="int8").factor == Fraction(
        9, 16
    )  # 128 + 4 x 4 bytes of 256
    assert lv.apply_lever(base, "lower precision", dtype="int4").factor == Fraction(5, 16)
    assert lv.apply_lever(base, "lower precision", dtype="fp8").bytes_per_token == 262_144


def test_the_hybrid_variant_has_jambas_cache_shape_and_state():
    hybrid = lv.apply_lever(lv.apply_lever(lv.base_variant(), "fewer KV heads"), "fewer attention layers")
    jamba = catalog_entry("Jamba-v0.1").spec
    assert hybrid.spec.attention_layers == jamba.attention_layers == (4, 12, 20, 28)
    assert bytes_per_token(hybrid.spec) == bytes_per_token(jamba) == 16_384
    # 28 Mamba layers x 8,192 channels x (4 conv inputs + 16 SSM numbers) x 2 bytes
    assert hybrid.state_bytes == lv.mamba_state_bytes(4096, 28) == 28 * 8192 * 20 * 2 == 9_175_040
    assert hybrid.sequence_bytes(1000) == 1000 * 16_384 + 9_175_040


def test_bad_levers_are_named():
    base = lv.base_variant()
    with pytest.raises(KVLibError, match="unknown lever"):
        lv.apply_lever(base, "more heads")
    with pytest.raises(KVLibError, match="apply paging first"):
        lv.apply_lever(base, "prefix sharing")
    with pytest.raises(KVLibError, match="no KV heads"):
        lv.apply_lever(lv.base_variant("DeepSeek-V3"), "fewer KV heads")
    with pytest.raises(KVLibError, match="multiple of num_kv_heads"):
        lv.apply_lever(base, "fewer KV heads", num_kv_heads=5)
    with pytest.raises(KVLibError, match="hidden_size"):
        lv.mamba_state_bytes(0, 28)
    with pytest.raises(KVLibError, match="num_layers"):
        lv.mamba_state_bytes(4096, -1)


def test_alone_variants_change_one_thing_each():
    alone = lv.alone_variants("Llama-2-7B")
    assert [v.lever for v in alone] == list(lv.LEVERS)
    assert [v.bytes_per_token for v in alone] == [131_072, 262_144, 65_536, 524_288, 524_288]
    assert alone[4].policy == "paged" and alone[4].prefix_caching and alone[3].policy == "paged"


def test_entry_levers_for_llama_2_7b():
    rows = lv.entry_levers("Llama-2-7B")
    assert [r["factor"] for r in rows] == ["1", "1/4", "1/32", "9/128"]
    assert rows[-1]["values per token and layer"] == 512 + 64


def test_kv_budget_and_roofline_reduce_to_chapter_4s_for_a_catalog_model():
    base = lv.base_variant("Llama-2-7B")
    ours, theirs = lv.variant_kv_budget(base), gm.kv_budget("Llama-2-7B")
    assert (ours.kv_bytes, ours.num_blocks, ours.bytes_per_token) == (
        theirs.kv_bytes,
        theirs.num_blocks,
        theirs.bytes_per_token,
    )
    step, ch4 = lv.variant_step_model(base), gm.roofline_step_model("Llama-2-7B")
    terms = ("fixed_s", "per_seq_s", "per_context_s", "per_prefill_s", "per_seq_memory_s", "overlapped")
    assert [getattr(step, t) for t in terms] == [
        getattr(ch4, t) for t in terms
    ]  # one A100 model for both chapters
    assert step.overlapped  # the larger of memory time and compute time, as a GPU overlaps them
    assert step.per_seq_s == pytest.approx(2 * 6_738_415_616 / 312e12)  # 43.2 µs of compute per decoded token
    # 128 sequences of 1,000 cached tokens: reading the weights and the cache (8.67 + 43.2 ms) outlasts the
    # arithmetic (128 x 43.2 µs = 5.5 ms), so the step is the memory time alone
    memory = 2 * 6_738_415_616 / 1.555e12 + 128_000 * 524_288 / 1.555e12
    assert step.predict(128, 128_000, 0) == pytest.approx(memory)
    # a prefill of 2,048 tokens is the arithmetic alone (88 ms against the weights' 8.67 ms)
    assert step.predict(1, 0, 2048) == pytest.approx(2049 * 2 * 6_738_415_616 / 312e12)


def test_the_state_of_every_schedulable_sequence_is_set_aside():
    hybrid = lv.lever_chain()[3]
    budget = lv.variant_kv_budget(hybrid, max_num_seqs=256)
    assert (
        budget.kv_bytes
        == int(0.9 * 40 * GiB) - weight_bytes(hybrid.num_parameters, "fp16") - 256 * hybrid.state_bytes
    )
    assert lv.variant_kv_budget(hybrid, max_num_seqs=0).num_blocks > budget.num_blocks
    assert (
        lv.variant_step_model(hybrid).per_seq_memory_s
        > lv.variant_step_model(replace(hybrid, state_bytes=0)).per_seq_memory_s
    )
    with pytest.raises(KVLibError, match="no room"):
        lv.variant_kv_budget(lv.base_variant("Llama-2-70B"))


def test_compute_shares_are_the_arithmetic_over_the_time_while_requests_wait():
    variant = lv.lever_chain("Llama-2-7B")[3]
    requests = lv.chain_trace(200, system_prompt_len=64, max_len=1024)
    run = lv.serve(variant, requests, max_len=1024, gpu=SMALL_GPU)
    steps, model = run.steps, lv.variant_step_model(variant, SMALL_GPU)
    busy = steps["num_waiting"] > 0
    assert busy.any() and not busy.all()  # the shares count only the steps while requests wait
    prefill = model.per_prefill_s * steps["prefill_tokens"][busy].sum()
    compute = model.per_seq_s * steps["num_seqs"][busy].sum() + prefill
    total = steps["duration_s"][busy].sum()
    assert lv.compute_shares(variant, run, SMALL_GPU) == pytest.approx((compute / total, prefill / total))


def test_max_batch_is_sizings_plus_the_state():
    base = lv.base_variant("Llama-2-7B")
    usable, weights = int(0.9 * 40 * GiB), weight_bytes(base.num_parameters, "fp16")
    assert lv.variant_max_batch(base, 4096) == max_batch(base.spec, 4096, usable, weights) == 11
    hybrid = lv.lever_chain()[3]
    assert lv.variant_max_batch(hybrid, 4096) == (usable - weights) // (4096 * 8192 + hybrid.state_bytes)
    assert lv.variant_max_batch(hybrid, 4096) < max_batch(hybrid.spec, 4096, usable, weights, dtype="fp8")
    assert lv.variant_max_batch(base, 4096, gpus.GPU("tiny", 8 * GiB, 1e12, 1e14)) == 0


def test_chain_trace_shares_one_system_prompt():
    requests = lv.chain_trace(50, system_prompt_len=32, max_len=1024)
    assert all(r.prompt[:32] == requests[0].prompt[:32] for r in requests)
    assert all(r.total_len <= 1024 and r.arrival_s == 0 for r in requests)
    assert len({r.prompt[32:40] for r in requests}) > 40
    assert (
        max(r.total_len for r in lv.chain_trace(1000)) == 4096
    )  # the longest are clipped to fit with the prompt
    with pytest.raises(KVLibError, match="does not fit"):
        lv.chain_trace(10, system_prompt_len=4096)
    with pytest.raises(KVLibError, match="do not fit"):
        lv.chain_trace(10, system_prompt_len=64, max_len=512)  # chapter 4's mean lengths need more room


def test_serving_the_chain_on_a_small_gpu():
    chain = lv.lever_chain("Llama-2-7B")
    requests = lv.chain_trace(300, system_prompt_len=64, max_len=1024)
    runs = [lv.serve(v, requests, max_len=1024, gpu=SMALL_GPU) for v in chain]
    assert all(len(r.finished) == len(requests) for r in runs)
    slots = [lv.kv_in_use(r)[0] for r in runs]
    assert slots[:4] == [1024.0] * 4  # max reserves max_len for every running request
    assert (
        slots[4] < 1024 / 2 and slots[5] < slots[4]
    )  # paging holds what requests use; sharing stores the prompt once
    batches = [r.mean_batch for r in runs]
    assert batches[0] < batches[1] < batches[2] < batches[3]
    prefilled = [r.steps["prefill_tokens"].sum() for r in runs]
    assert prefilled[5] < prefilled[4] - 0.8 * 64 * len(
        requests
    )  # the system prompt is prefilled a few times, not 300
    rows = lv.chain_table(chain, runs, 1024, SMALL_GPU)
    assert [r["step"] for r in rows] == list(range(6)) and rows[0]["x baseline"] == 1.0
    # each step of the simulator is timed by the variant's roofline: the larger of memory and compute time
    for variant, run in zip(chain, runs, strict=True):
        steps, model = run.steps, lv.variant_step_model(variant, SMALL_GPU)
        predicted = model.predict(steps["num_seqs"], steps["context_tokens"], steps["prefill_tokens"])
        assert steps["duration_s"] == pytest.approx(predicted)
    # the compute part of a step never exceeds its duration (up to rounding), and the prompts' part is in it
    shares = [(r["prefill share of the time (%)"], r["compute share of the time (%)"]) for r in rows]
    assert all(0 < prefill < compute < 100 + 1e-9 for prefill, compute in shares)
    assert shares[4][1] == pytest.approx(100)  # paged on this small GPU: every step is bound by arithmetic
    assert rows[3]["max batch at 1,024"] == lv.variant_max_batch(chain[3], 1024, SMALL_GPU)
    assert all(0 < r["budget allocated (%)"] <= 100 for r in rows)
    fig = draw_chain(rows, 1024, max_num_seqs=256)
    assert len(fig.axes[0].lines) == 6  # five quantities and the cap
