"""kvlib.gpus: the data sheets the chapters read, and what chapter 2 computes from the 32 GB consumer GPU."""

from kvlib import gpus
from kvlib.sizing.capacity import max_batch, weight_bytes
from kvlib.sizing.catalog import catalog_entry
from kvlib.units import GiB


def test_the_rtx_5090_is_its_data_sheet():
    gpu = gpus.RTX_5090
    assert gpu.memory_bytes == 32 * 2**30  # 32 GB of GDDR7, in binary units like the A100's 40 GB
    assert gpu.bandwidth == 1.792e12  # 512-bit bus x 28 Gbps per pin
    assert gpu.fp16_flops == 419e12  # 838 sparse TFLOPS, dense
    assert "RTX 5090" in gpu.name


def test_the_consumer_gpu_sits_below_the_a100_in_memory_and_above_it_in_bandwidth():
    assert gpus.RTX_5090.memory_bytes < gpus.A100_40GB.memory_bytes
    assert gpus.RTX_5090.bandwidth > gpus.A100_40GB.bandwidth


def _max_batch(name, context, memory, dtype):
    entry = catalog_entry(name)
    weights = weight_bytes(entry.num_parameters, "bf16")
    return max_batch(entry.spec, context, memory, weights, 4 * GiB, dtype)


def test_chapter_2s_figures_on_the_32_gb_gpu():
    memory = gpus.RTX_5090.memory_bytes
    # Llama-3-8B: 14,004,248,576 bytes free beside its bf16 weights and 4 GiB; 1 GiB per fp16 sequence
    assert _max_batch("Llama-3-8B", 8192, memory, "fp16") == 13
    assert _max_batch("Llama-3-8B", 8192, memory, "fp8") == 26
    # Qwen2.5-7B at its full 131,072 tokens: 7 GiB per fp16 sequence (GQA, 4 KV heads of 28 layers)
    assert _max_batch("Qwen2.5-7B", 131_072, memory, "fp16") == 1
    assert _max_batch("Qwen2.5-7B", 131_072, memory, "fp8") == 3
