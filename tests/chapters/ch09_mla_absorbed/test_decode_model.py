"""Chapter 9's modelled numbers against hand arithmetic, its measured runs and its bench fields."""

from kvlib.chapters.ch09_mla_absorbed.bench import bench
from kvlib.chapters.ch09_mla_absorbed.decode_model import (
    decode_forms,
    deepseek_v3_shape,
    gpu_ridge,
    parallel_table,
    roofline_table,
)
from kvlib.chapters.ch09_mla_absorbed.measured import step_timings
from kvlib.model.mla import MLAConfig


def test_deepseek_v3_forms_by_hand():
    absorbed, expanded = decode_forms(deepseek_v3_shape())
    assert (absorbed.values_read, absorbed.bytes_read) == (576, 1152)
    assert absorbed.flops == 128 * 2 * (576 + 512) and expanded.values_read == 128 * (128 + 64 + 128)
    assert expanded.intensity == 1.0 and absorbed.intensity > gpu_ridge() > expanded.intensity
    rows = roofline_table([deepseek_v3_shape()])
    assert [r["bound"] for r in rows] == ["compute", "memory"]
    assert rows[0]["bytes read / token"] == 1152 * 61


def test_tp_keeps_the_latent_whole_and_dp_attention_splits_the_batch():
    rows = {(r["model"], r["layout"]): r["bytes"] for r in parallel_table(8192, 64, 8)}
    one = rows[("DeepSeek-V3", "one GPU")]
    assert rows[("DeepSeek-V3", "TP 8")] == one == 8 * rows[("DeepSeek-V3", "DP attention 8")]
    assert rows[("Llama-3-70B", "TP 8")] * 8 == rows[("Llama-3-70B", "one GPU")]


def test_step_timings_agree_and_bench_has_its_fields():
    small = MLAConfig(
        num_layers=1,
        hidden_size=64,
        num_heads=2,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
    )
    timing = step_timings(small, context=32, repeats=2)
    assert timing["max_gap"] < 1e-5 and timing["absorbed_s"] > 0
    fields = bench()
    assert (
        fields["mla_absorbed_tokens_identical"] is True and fields["mla_absorbed_bytes_per_token"] == 70_272
    )
    assert fields["mla_absorbed_decode_speedup"] > 0
