"""Every config shape of tests/sizing/fixtures/ (published Hub configs, see its README) sized by hand.

Each case: (fixture, context, expected total bytes in fp16, batch 1), with the arithmetic
written out: layers x K,V x KV heads x head_dim x 2 bytes x tokens each layer keeps.
"""

from pathlib import Path

import pytest

from kvlib.sizing.config_reader import spec_from_config
from kvlib.sizing.spec import cache_size

FIXTURES = Path(__file__).parent / "fixtures"
KV = 2  # K and V
FP16 = 2  # bytes per value

CASES = [
    # Gemma-3-1B: 26 layers, global when (i + 1) % 6 == 0: layers 5, 11, 17, 23 (4); 22 slide over 512
    ("google__gemma-3-1b-it", 32768, (4 * 32768 + 22 * 512) * KV * 1 * 256 * FP16),
    # Gemma-3-4B (text_config; heads, head_dim and maximum from transformers' defaults): 34 layers,
    # globals 5, 11, 17, 23, 29 (5), 29 slide over 1024; 4 KV heads x 256
    ("google__gemma-3-4b-it", 131072, (5 * 131072 + 29 * 1024) * KV * 4 * 256 * FP16),
    # Command R7B: pattern 4: layers 3, 7, ..., 31 global (8), 24 slide over 4096; 8 KV heads x 128
    ("CohereForAI__c4ai-command-r7b-12-2024", 8192, (8 * 8192 + 24 * 4096) * KV * 8 * 128 * FP16),
    # Bamba-9B: attention only in layers 9, 18, 27
    ("ibm-ai-platform__Bamba-9B", 100_000, 3 * 100_000 * KV * 8 * 128 * FP16),
    # Nemotron-H-8B: four '*' in the 52-letter pattern; attention_head_dim 128
    ("nvidia__Nemotron-H-8B-Base-8K", 8192, 4 * 8192 * KV * 8 * 128 * FP16),
    # Granite-4.0-H-Small: layer_types has 4 "attention" among 36 "mamba"
    ("ibm-granite__granite-4.0-h-small", 131072, 4 * 131072 * KV * 8 * 128 * FP16),
    # Llama-4-Scout: 48 layers, every 4th global (12), 36 chunked: at most 8192 tokens each
    (
        "meta-llama__Llama-4-Scout-17B-16E-Instruct",
        1_000_000,
        (12 * 1_000_000 + 36 * 8192) * KV * 8 * 128 * FP16,
    ),
    # Llama-3.2-11B-Vision: 32 self-attention layers over the text, 8 cross-attention layers
    # over one image's tokens: 4 tiles x ((560 / 14)^2 + 1) = 4 x 1601 = 6404
    ("meta-llama__Llama-3.2-11B-Vision-Instruct", 4096, (32 * 4096 + 8 * 6404) * KV * 8 * 128 * FP16),
    # Qwen2-VL-7B: text_config, use_sliding_window false: every layer full; 28 layers x 4 KV heads
    ("Qwen__Qwen2-VL-7B-Instruct", 32768, 28 * 32768 * KV * 4 * 128 * FP16),
    # Qwen2-7B: sliding_window 131072 but use_sliding_window false
    ("Qwen__Qwen2-7B-Instruct", 32768, 28 * 32768 * KV * 4 * 128 * FP16),
    # OpenELM-270M: KV heads per layer 3 x5, 4 x7, 5 x4 = 63 heads in all, head_dim 64
    ("apple__OpenELM-270M", 2048, (5 * 3 + 7 * 4 + 4 * 5) * 2048 * KV * 64 * FP16),
    # DeepSeek-V2-Lite (MLA): one latent of 512 + 64 values per token and layer, 27 layers
    ("deepseek-ai__DeepSeek-V2-Lite", 10_000, 27 * 10_000 * (512 + 64) * FP16),
    # T5-base: 12 decoder layers x 12 heads x d_kv 64; cross-attention over 512 encoder positions
    ("google-t5__t5-base", 512, 12 * (512 + 512) * KV * 12 * 64 * FP16),
    # Flan-T5-XL: num_decoder_layers 24, 32 heads x d_kv 64
    ("google__flan-t5-xl", 100, 24 * (100 + 512) * KV * 32 * 64 * FP16),
    # BART-large: 12 decoder layers, 16 heads x 1024/16; encoder length 1024 (its maximum)
    ("facebook__bart-large", 1024, 12 * (1024 + 1024) * KV * 16 * 64 * FP16),
    # Whisper-small: 12 decoder layers, 12 heads x 64; 1500 encoder positions
    ("openai__whisper-small", 448, 12 * (448 + 1500) * KV * 12 * 64 * FP16),
    # GPT-2: n_layer 12, n_head 12, n_embd 768 (head_dim 64)
    ("openai-community__gpt2", 1024, 12 * 1024 * KV * 12 * 64 * FP16),
    # GPT-J-6B: 28 layers, 16 heads of 4096/16 = 256
    ("EleutherAI__gpt-j-6b", 2048, 28 * 2048 * KV * 16 * 256 * FP16),
    # Pythia-6.9B (GPT-NeoX): 32 layers x 32 heads x 128
    ("EleutherAI__pythia-6.9b", 2048, 32 * 2048 * KV * 32 * 128 * FP16),
    # MPT-7B: n_layers 32, n_heads 32, d_model 4096, multihead attention
    ("mosaicml__mpt-7b", 2048, 32 * 2048 * KV * 32 * 128 * FP16),
    # DBRX: 40 layers, attn_config.kv_n_heads 8, 6144/48 = 128
    ("databricks__dbrx-instruct", 32768, 40 * 32768 * KV * 8 * 128 * FP16),
    # ChatGLM3-6B: num_layers 28, multi_query_group_num 2, kv_channels 128
    ("THUDM__chatglm3-6b", 8192, 28 * 8192 * KV * 2 * 128 * FP16),
    # Falcon-40B: new_decoder_architecture, num_kv_heads 8, 8192/128 = 64; maximum 2048 (default)
    ("tiiuae__falcon-40b", 2048, 60 * 2048 * KV * 8 * 64 * FP16),
    # StarCoder (GPT-BigCode): multi_query: one KV head, 6144/48 = 128
    ("bigcode__starcoder", 8192, 40 * 8192 * KV * 1 * 128 * FP16),
    # Phi-3-mini-4k: every layer slides over 2047 tokens; 32 KV heads x 3072/32 = 96
    ("microsoft__Phi-3-mini-4k-instruct", 4096, 32 * 2047 * KV * 32 * 96 * FP16),
    # Gemma-2-2B: even layers slide over 4096 (13), odd layers global (13); 4 KV heads x 256
    ("google__gemma-2-2b", 8192, (13 * 8192 + 13 * 4096) * KV * 4 * 256 * FP16),
    # Qwen3-Next-80B: full attention when (i + 1) % 4 == 0: 12 of 48; 2 KV heads x 256
    ("Qwen__Qwen3-Next-80B-A3B-Instruct", 262144, 12 * 262144 * KV * 2 * 256 * FP16),
    # gpt-oss-20b: layer_types alternate sliding (128 tokens) and full, 12 each; 8 KV heads x 64
    ("openai__gpt-oss-20b", 131072, (12 * 128 + 12 * 131072) * KV * 8 * 64 * FP16),
    # Jamba-v0.1: attention where i % 8 == 4: layers 4, 12, 20, 28
    ("ai21labs__Jamba-v0.1", 262144, 4 * 262144 * KV * 8 * 128 * FP16),
]


def test_there_are_at_least_25_shapes_and_each_is_tested():
    files = {path.stem for path in FIXTURES.glob("*.json")}
    assert len(files) >= 25
    assert files == {case[0] for case in CASES}
    readme = (FIXTURES / "README.md").read_text()
    for name in files:
        assert name.replace("__", "/") in readme, name


@pytest.mark.parametrize("fixture, context, expected", CASES, ids=[c[0] for c in CASES])
def test_fixture_sizes_by_hand(fixture, context, expected):
    spec = spec_from_config(FIXTURES / f"{fixture}.json")
    assert cache_size(spec, context).total_bytes == expected


def test_llama_vision_image_tokens_can_be_set():
    spec = spec_from_config(
        FIXTURES / "meta-llama__Llama-3.2-11B-Vision-Instruct.json", image_tokens=2 * 6404
    )
    one_token = KV * 8 * 128 * FP16
    assert cache_size(spec, 10).cross_attention_bytes == 8 * 2 * 6404 * one_token
    assert cache_size(spec, 10).self_attention_bytes == 32 * 10 * one_token


def test_bart_encoder_length_can_be_set():
    spec = spec_from_config(FIXTURES / "facebook__bart-large.json", encoder_tokens=100)
    assert cache_size(spec, 10).cross_attention_bytes == 12 * 100 * KV * 16 * 64 * FP16
