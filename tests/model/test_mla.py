"""The MLA model of chapter 9: absorbed and expanded decode are the same function, up to float32 rounding."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.model.mla import MLAConfig, TinyMLA

# float32 rounds each product and sum to 2^-24 relative; the two forms sum over the rank (64) and the
# head dims (32) in another order, so their logits (of size ~2) differ by a few 1e-7 each way.
# 1e-5 absolute is ~100x that rounding and far below any real bug (a wrong weight moves logits by ~0.1).
ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return TinyMLA(MLAConfig(num_layers=2))


def test_absorbed_and_expanded_logits_agree_in_prefill_and_decode(model):
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    absorbed, expanded = model.new_cache(), model.new_cache()
    for chunk in (tokens[:, :10], tokens[:, 10:11], tokens[:, 11:]):
        a, e = model(chunk, absorbed, True), model(chunk, expanded, False)
        assert torch.allclose(a, e, atol=ATOL, rtol=0)
    assert absorbed.seq_len == 12 and absorbed.num_bytes() == 2 * 2 * 12 * (64 + 16) * 4


def test_decoding_one_token_at_a_time_equals_one_prefill(model):
    tokens = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    whole = model(tokens, model.new_cache(), True)[0, -1]
    cache = model.new_cache()
    for i in range(6):
        step = model(tokens[:, i : i + 1], cache, True)[0, -1]
    assert torch.allclose(whole, step, atol=ATOL, rtol=0)


def test_greedy_tokens_identical_and_weights_seeded():
    config = MLAConfig(num_layers=3, q_lora_rank=None)
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(2))
    first, again = TinyMLA(config), TinyMLA(config)
    tokens = first.generate(prompt, 12, absorbed=True)
    assert tokens == first.generate(prompt, 12, absorbed=False) == again.generate(prompt, 12)


def test_bad_input_is_a_kvlib_error(model):
    with pytest.raises(KVLibError, match="qk_rope_head_dim"):
        MLAConfig(qk_rope_head_dim=7)
    with pytest.raises(KVLibError, match="prompt"):
        model.generate(torch.tensor([[300]]), 2)
    with pytest.raises(KVLibError, match="num_new_tokens"):
        model.generate(torch.tensor([[3]]), 0)
