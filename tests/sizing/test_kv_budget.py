"""The one KV budget (kvlib.sizing.capacity.kv_budget_bytes) that every capacity of the book calls."""

from kvlib.chapters.ch05_levers.levers import lever_chain, variant_kv_budget
from kvlib.gpus import A100_40GB, MEMORY_FRACTION
from kvlib.serving.roofline import kv_budget
from kvlib.sizing.capacity import free_bytes, kv_budget_bytes, weight_bytes
from kvlib.sizing.catalog import catalog_entry


def test_the_budget_is_memory_times_the_share_minus_what_is_not_kv():
    assert kv_budget_bytes(80 * 2**30, 16 * 2**30) == 64 * 2**30  # a share of 1 stays in integers
    assert kv_budget_bytes(2**60 + 1, 1) == 2**60  # exact beyond 2**53, where a float would round
    assert kv_budget_bytes(1000, 100, 0.9) == 800
    assert kv_budget_bytes(1000, 2000) == -1000  # the weights alone do not fit


def test_free_bytes_and_chapter_4s_budget_call_it():
    assert free_bytes(1000, 300, 200) == kv_budget_bytes(1000, 500)
    budget = kv_budget("OPT-13B", A100_40GB.memory_bytes, MEMORY_FRACTION)
    weights = weight_bytes(catalog_entry("OPT-13B").num_parameters, "fp16")
    assert budget.kv_bytes == kv_budget_bytes(A100_40GB.memory_bytes, weights, MEMORY_FRACTION)


def test_chapter_5s_levers_count_the_fixed_states_as_not_kv():
    variant = lever_chain()[-1]
    budget = variant_kv_budget(variant, max_num_seqs=7)
    weights = weight_bytes(variant.num_parameters, "fp16")
    expected = kv_budget_bytes(A100_40GB.memory_bytes, weights + 7 * variant.state_bytes, MEMORY_FRACTION)
    assert budget.kv_bytes == expected
