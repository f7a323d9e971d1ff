"""A model over several GPUs and disaggregated prefill/decode
(kvlib.chapters.ch08_serving_engines.disaggregation, chapter 8):
per-GPU weights and K/V of a Llama-3-70B by hand, the hand-over against the prefill, the pools' ratio."""

import math

import pytest

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.disaggregation import (
    LINKS,
    Link,
    bench,
    gpu_layout,
    layout_table,
    pd_gpu_ratio,
    pd_transfer,
    prefill_seconds,
    transfer_table,
)
from kvlib.units import GiB

PARAMS = 70_553_706_496  # Llama-3-70B (kvlib/sizing/configs/llama_3_70b.json)
PER_TOKEN = 2 * 80 * 8 * 128 * 2  # K and V, 80 layers, 8 KV heads, head_dim 128, fp16: 327,680 bytes
H100_FLOPS, H100_BW = 989e12, 3.35e12


def test_tensor_parallelism_splits_kv_heads_and_weights():
    layout = gpu_layout("Llama-3-70B", 8, 1, "H100")
    assert layout.kv_heads_per_gpu == 1
    assert layout.kv_bytes_per_token == PER_TOKEN // 8 == 40_960
    assert layout.weight_bytes_per_gpu == math.ceil(2 * PARAMS / 8)
    assert layout.kv_tokens == (int(80 * GiB * 0.9) - math.ceil(2 * PARAMS / 8)) // 40_960
    assert layout.num_gpus == 8


def test_beyond_the_kv_heads_each_head_is_replicated():
    layout = gpu_layout("Llama-3-70B", 16, 1, "H100")  # 16 ranks for 8 KV heads: each caches one
    assert layout.kv_heads_per_gpu == 1 and layout.kv_bytes_per_token == 40_960


def test_pipeline_stages_split_the_layers():
    layout = gpu_layout("Llama-3-70B", 2, 4, "A100 80GB")  # 20 layers, 4 KV heads per GPU
    assert layout.kv_bytes_per_token == 2 * 20 * 4 * 128 * 2
    assert layout.weight_bytes_per_gpu == math.ceil(2 * PARAMS / 8)


def test_a_70b_model_does_not_fit_on_one_gpu():
    rows = layout_table()
    assert rows[0]["fits"] is False and rows[0]["KV tokens (whole group)"] == 0
    assert [r["KV tokens (whole group)"] for r in rows[:4]] == sorted(
        r["KV tokens (whole group)"] for r in rows[:4]
    )


def test_the_handoff_moves_each_gpus_heads_over_its_link():
    handoff = pd_transfer("Llama-3-70B", 2048, "NVLink 4 (H100)", "H100", 4)
    assert handoff.kv_bytes == 2048 * PER_TOKEN  # 640 MiB
    assert handoff.kv_bytes_per_gpu == 2048 * PER_TOKEN // 4
    assert handoff.transfer_s == pytest.approx(2048 * PER_TOKEN / 4 / 450e9)
    # the larger of one read of the weights and 2 x params FLOPs for each of the 2,048 prompt tokens (and
    # the sequence's own token), over 4 GPUs: compute-bound
    prefill = max(2 * PARAMS / H100_BW, 2 * PARAMS / H100_FLOPS + 2048 * 2 * PARAMS / H100_FLOPS) / 4
    assert handoff.prefill_s == pytest.approx(prefill)
    assert handoff.ratio == pytest.approx(handoff.transfer_s / prefill)


def test_for_long_prompts_the_ratio_is_bytes_times_flops_over_parameters_times_link():
    closed_form = PER_TOKEN * H100_FLOPS / (2 * PARAMS * 50e9)  # 400 Gb/s: 0.046
    for tp in (2, 4, 8):
        ratio = pd_transfer(prompt_len=32_768, link="400 Gb/s IB/RoCE", tensor_parallel_size=tp).ratio
        # the sequence's own token makes the prefill a bit longer
        assert 0.95 * closed_form < ratio < closed_form


def test_slower_links_and_faster_gpus_make_the_handoff_weigh_more():
    rows = transfer_table()
    h100 = [r["transfer / prefill"] for r in rows if r["GPU"] == "NVIDIA H100 SXM"]
    assert h100 == sorted(h100)  # NVLink, then 400, 200, 100 Gb/s
    assert pd_transfer(gpu="H100").ratio > pd_transfer(gpu="A100 80GB").ratio
    assert prefill_seconds("Llama-3-70B", 1024, "H100", 4) < prefill_seconds("Llama-3-70B", 1024, "H100", 2)


def test_the_decode_batch_is_the_largest_within_the_tpot_target():
    plan = pd_gpu_ratio(tpot_s=0.02, gpu="H100", decode_tensor_parallel_size=4, max_num_seqs=1024)
    fixed, per_seq = 2 * PARAMS / H100_BW, 2 * PARAMS / H100_FLOPS
    context = 161.31 + 337.99 / 2
    # a step takes the larger of its memory time (weights, contexts) and its compute time (each token)
    batch = int(min((0.02 * 4 - fixed) / (context * PER_TOKEN / H100_BW), 0.02 * 4 / per_seq))
    assert plan.decode_batch == batch and plan.decode_limit == "TPOT"
    step = max(fixed + batch * context * PER_TOKEN / H100_BW, batch * per_seq) / 4
    assert plan.decode_step_s == pytest.approx(step) and step <= 0.02
    assert plan.decode_requests_per_gpu_s == pytest.approx(batch / step / 337.99 / 4)
    prefill = 161.31 * max(fixed, per_seq + 2048 * 2 * PARAMS / H100_FLOPS) / 2048
    assert plan.prefill_gpu_s_per_request == pytest.approx(prefill)
    assert plan.decode_gpus_per_prefill_gpu == pytest.approx((1 / prefill) / plan.decode_requests_per_gpu_s)
    assert plan.prefill_share(8) == pytest.approx(8 / (1 + plan.decode_gpus_per_prefill_gpu))


def test_long_prompts_need_more_prefill_gpus():
    chat, documents = pd_gpu_ratio(), pd_gpu_ratio(mean_prompt_len=2000, mean_output_len=200)
    assert chat.decode_limit == "max_num_seqs" and documents.decode_limit == "memory"
    assert documents.decode_gpus_per_prefill_gpu < 1 < chat.decode_gpus_per_prefill_gpu


def test_bench_reports_the_ratio_of_the_sized_example():
    result = bench()
    assert result["pd_transfer_vs_prefill_ratio"] == pytest.approx(pd_transfer().ratio, abs=1e-5)
    assert 0 < result["pd_transfer_vs_prefill_ratio"] < result["pd_transfer_vs_prefill_ratio_400g"] < 0.1


@pytest.mark.parametrize(
    "call",
    [
        lambda: gpu_layout("Llama-3-70B", 3),  # 64 heads are not divisible by 3
        lambda: gpu_layout("Llama-3-70B", 0),
        lambda: gpu_layout("Llama-3-70B", gpu="B200"),
        lambda: gpu_layout("no such model"),
        lambda: gpu_layout(memory_fraction=1.5),
        lambda: pd_transfer(link="carrier pigeon"),
        lambda: pd_transfer(prompt_len=0),
        lambda: pd_gpu_ratio(tpot_s=0.001),  # one sequence's step takes longer
        lambda: pd_gpu_ratio(decode_tensor_parallel_size=0),
        lambda: pd_gpu_ratio(mean_output_len=-1),
        lambda: pd_gpu_ratio().prefill_share(0),
    ],
)
def test_bad_input_is_one_line_error(call):
    with pytest.raises(KVLibError):
        call()


def test_a_link_of_ones_own():
    slow = Link("1 Gb/s", 1e9 / 8, "a test")
    assert pd_transfer(link=slow).ratio == pytest.approx(
        pd_transfer(link=LINKS["NVLink 4 (H100)"]).ratio * 3600
    )
