"""Memory saved by sharing blocks (kvlib.chapters.ch04_serving.sharing): parallel sampling and beam search
with
copy-on-write, checked against exact counts and a beam search without any cache."""

import numpy as np
import pytest
import torch

from kvlib import KVLibError
from kvlib.cache.generation import generate
from kvlib.chapters.ch04_serving.sharing import (
    SharingCount,
    beam_search,
    beam_search_reference,
    parallel_sampling_blocks,
)
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama

MODEL = TinyLlama(
    ModelConfig(
        vocab_size=97, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=96, max_seq_len=256
    )
)
PROMPT = list(range(5, 25))


def test_parallel_sampling_counts_shared_and_copied_blocks_exactly():
    count = parallel_sampling_blocks(prompt_len=20, output_len=3, n=2, block_size=16)
    # step 0: both samples share the prompt's 2 blocks; then the first append copies the shared
    # last block (16 + 4 tokens), the second sample writes into it in place: 3 blocks
    assert count.used_blocks.tolist() == [2, 3, 3] and count.unshared_blocks.tolist() == [4, 4, 4]
    assert count.saving == pytest.approx(1 - 8 / 12)
    assert parallel_sampling_blocks(20, 10, n=1).saving == 0.0


def test_parallel_sampling_saves_more_with_more_samples_and_less_with_longer_outputs():
    savings = [parallel_sampling_blocks(40, 60, n).saving for n in (2, 4, 6)]
    assert savings == sorted(savings) and savings[0] > 0
    assert parallel_sampling_blocks(40, 600, 4).saving < parallel_sampling_blocks(40, 60, 4).saving


def test_totals_concatenate_the_steps_of_several_requests():
    a, b = parallel_sampling_blocks(20, 3, 2), parallel_sampling_blocks(40, 5, 3)
    total = SharingCount.total([a, b])
    assert total.saving == pytest.approx(
        1 - (a.used_blocks.sum() + b.used_blocks.sum()) / (a.unshared_blocks.sum() + b.unshared_blocks.sum())
    )


@pytest.mark.parametrize("width", [1, 2, 4])
@pytest.mark.parametrize("block_size", [4, 16])
def test_beam_search_on_the_paged_cache_finds_the_beams_of_a_search_without_cache(width, block_size):
    run = beam_search(MODEL, PROMPT, width, 12, block_size=block_size)
    beams, scores = beam_search_reference(MODEL, PROMPT, width, 12)
    assert run.beams == beams
    assert np.allclose(run.scores, scores, atol=1e-4)
    assert len(run.count.used_blocks) == 11
    assert np.all(run.count.used_blocks <= run.count.unshared_blocks)
    if width > 1:
        assert run.num_copies > 0 and run.count.saving > 0.2
    else:
        assert run.count.saving == 0.0 and run.num_copies == 0


def test_beam_width_one_is_greedy_decoding():
    run = beam_search(MODEL, PROMPT, 1, 10)
    assert run.beams[0] == generate(MODEL, torch.tensor([PROMPT]), 10, "cache").tokens[0].tolist()


def test_bad_sharing_input_is_named():
    with pytest.raises(KVLibError, match="width"):
        beam_search(MODEL, PROMPT, 0, 5)
    with pytest.raises(KVLibError, match="positive"):
        parallel_sampling_blocks(0, 5, 2)
