"""StepInputs: a forward pass's integers in buffers kept between passes (kvlib.paged.step_inputs), and
the paged greedy step that reads them allocating no tensor."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.chapters.ch01_no_cache.step_roofline import count_step_ops
from kvlib.kernels.dispatch import numba_module
from kvlib.model.config import ModelConfig
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import generate_paged, give_slots, greedy, greedy_step, prefill
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.paged.step_inputs import StepInputs


def test_put_hands_out_views_of_one_buffer_that_grows_when_needed():
    inputs = StepInputs()
    first = inputs.put("slots", [4, 5, 6])
    assert first.tolist() == [4, 5, 6] and first.dtype == torch.long
    again = inputs.put("slots", [7, 8])
    assert again.tolist() == [7, 8] and again.data_ptr() == first.data_ptr()  # the same memory
    assert first.tolist() == [7, 8, 6]  # a step's views are overwritten by the next step
    grown = inputs.put("slots", list(range(10)))
    assert grown.tolist() == list(range(10))
    assert inputs.put("other", [1]).data_ptr() != grown.data_ptr()


def test_rows_are_padded_to_the_width_and_a_longer_row_is_an_error():
    inputs = StepInputs()
    assert inputs.put_rows("tables", [[3], [1, 2, 9]], 3).tolist() == [[3, 0, 0], [1, 2, 9]]
    with pytest.raises(KVLibError, match="longer than the width 2"):
        inputs.put_rows("tables", [[1, 2, 3]], 2)


def test_scratch_keeps_its_memory_for_smaller_shapes_and_works_outside_inference_mode():
    inputs = StepInputs()
    with torch.inference_mode():
        big = inputs.scratch("logits", (4, 10), torch.float32)
        put = inputs.put("tokens", [1, 2])
    small = inputs.scratch("logits", (2, 10), torch.float32)
    assert small.shape == (2, 10) and small.data_ptr() == big.data_ptr()
    small.fill_(1.0)  # made under inference mode, still an ordinary tensor
    put.add_(1)
    assert inputs.scratch("logits", (2, 10), torch.float64).dtype == torch.float64


SMALL = dict(vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=96, max_seq_len=256)


def _started(model, prompts, block_size=16):
    cache = PagedKVCache.for_model(model, 64, block_size)
    tokens = [list(p) for p in prompts]
    for seq_id, seq_tokens in enumerate(tokens):
        allocation = cache.manager.allocate(seq_id, seq_tokens)
        logits = prefill(model, cache, seq_id, seq_tokens, allocation.num_cached_tokens)
        seq_tokens.append(int(logits.argmax()))
    return cache, tokens


def test_the_greedy_step_on_the_paged_cache_allocates_no_tensor():
    """After the first decode step of a batch (which sizes the buffers), one step's operators write
    only into buffers: the lean model's StepBuffers, the cache's StepInputs and its PoolDecoder's q."""
    model = LeanLlama(ModelConfig(**SMALL)).eval()
    cache, tokens = _started(model, [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]])
    seq_ids = [0, 1, 2]

    def step():
        give_slots(cache, seq_ids)
        for seq_tokens, token in zip(tokens, greedy_step(model, cache, seq_ids, tokens, False), strict=True):
            seq_tokens.append(token)

    step()
    num_ops, num_allocating = count_step_ops(step)
    assert num_ops > 0
    if numba_module() is not None:
        assert num_allocating == 0
    assert generate_paged(model, [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]], 3).tokens == tokens


def test_the_greedy_step_picks_what_greedy_picks_from_the_logits():
    from kvlib.paged.decode_loop import decode_step

    model = TinyLlama(ModelConfig(**SMALL)).eval()
    cache_a, tokens_a = _started(model, [[5, 6], [7]])
    cache_b, tokens_b = _started(model, [[5, 6], [7]])
    for _ in range(4):
        picked = greedy_step(model, cache_a, [0, 1], tokens_a)
        assert picked == greedy(decode_step(model, cache_b, [0, 1], tokens_b))
        for seqs in (tokens_a, tokens_b):
            for seq_tokens, token in zip(seqs, picked, strict=True):
                seq_tokens.append(token)


def test_on_another_device_the_values_are_copied_into_a_buffer_there():
    """Here the meta device (every machine has it) stands in for a GPU: a buffer on the device,
    reused from step to step, receives the host buffer's values."""
    inputs = StepInputs("meta")
    first = inputs.put("slots", [1, 2, 3])
    second = inputs.put("slots", [4, 5])
    assert first.device.type == second.device.type == "meta" and second.shape == (2,)
    assert inputs._host["slots"][0].tolist()[:2] == [4, 5]  # what was copied over
    assert inputs.put_rows("tables", [[1], [2, 3]], 2).shape == (2, 2)
    assert inputs.scratch("logits", (2, 5), torch.float32).device.type == "meta"
