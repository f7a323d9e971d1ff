"""Tests of kvlib.chapters.ch02_cache_size.size_check: measured bytes of real caches equal the formula: our
contiguous
caches (MHA/GQA/MQA) and the DynamicCache of transformers' generate (GQA Llama, MLA DeepSeek-V3)."""

import pytest
import torch

from kvlib.chapters.ch02_cache_size import size_check as sizecheck
from kvlib.model.config import ModelConfig

SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=8, d_ff=96, max_seq_len=64)


@pytest.mark.parametrize("kv_heads", [8, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_kvlib_caches_match_the_formula(kv_heads):
    checks = sizecheck.kvlib_cache_checks(
        ModelConfig(**SMALL, num_kv_heads=kv_heads), batch=3, prompt_len=4, num_new=6
    )
    assert [c.tokens for c in checks] == [10, 9]  # reserved prompt + new; filled: the last token is never fed
    for check in checks:
        assert check.measured_bytes == check.predicted_bytes, check


def test_storage_bytes_counts_shared_storage_once():
    t = torch.zeros(4, 8)
    assert sizecheck.storage_bytes([t, t[1:], t.T]) == 4 * 8 * 4


@pytest.mark.parametrize(
    "config", [sizecheck.small_llama_config, sizecheck.small_deepseek_config], ids=["GQA", "MLA"]
)
def test_transformers_dynamic_cache_matches_the_formula(config):
    check = sizecheck.transformers_cache_check(config(), batch=2, prompt_len=5, num_new=7)
    assert check.tokens == 5 + 7 - 1
    assert check.kind == ("GQA" if config is sizecheck.small_llama_config else "MLA")
    assert check.measured_bytes == check.predicted_bytes
