"""Tests of kvlib.model.rotary: the precomputed table gives the computed angles bit for bit."""

import pytest
import torch

from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.model.rotary import (
    RotaryTable,
    apply_rotary,
    new_token_rotary,
    rotary_cos_sin,
    rotary_inv_freq,
    rotate_signed_into,
)


@pytest.mark.parametrize("d_model, num_heads", [(64, 1), (384, 6), (64, 8), (32, 4)])
@pytest.mark.parametrize("batch, seq", [(1, 1), (3, 1), (2, 5)])
def test_table_rows_equal_the_computed_angles(d_model, num_heads, batch, seq):
    config = ModelConfig(d_model=d_model, num_heads=num_heads, num_kv_heads=1, max_seq_len=512)
    table = RotaryTable(config)
    inv_freq = rotary_inv_freq(config.head_dim, config.rope_theta)
    for start in (0, 1, 37, 512 - seq):
        positions = torch.arange(start, start + seq).expand(batch, seq)
        computed, looked_up = rotary_cos_sin(positions, inv_freq), table.lookup(positions)
        assert looked_up[0].shape == (batch, 1, seq, config.head_dim)
        assert torch.equal(computed[0], looked_up[0]) and torch.equal(computed[1], looked_up[1])


def test_table_is_built_once_per_device_and_stays_float32():
    config = ModelConfig(max_seq_len=64)
    model = TinyLlama(config).eval()
    first = model.rotary.tables("cpu")
    assert model.rotary.tables(torch.device("cpu"))[0] is first[0]
    assert first[0].shape == (64, config.head_dim) and first[0].dtype == torch.float32
    model.half()  # the angles are not a parameter or buffer: halving the model must not round them
    assert model.rotary.tables("cpu")[1].dtype == torch.float32
    assert not any("rotary" in key for key in model.state_dict())


def test_new_token_rotary_with_and_without_a_table_agree():
    config = ModelConfig(max_seq_len=32)
    tokens = torch.zeros(2, 7, dtype=torch.long)
    with_table = new_token_rotary(tokens, None, config, RotaryTable(config))
    without = new_token_rotary(tokens, None, config)
    assert all(torch.equal(a, b) for a, b in zip(with_table, without, strict=True))


def test_positions_past_max_seq_len_grow_the_table_with_the_same_rows():
    """A paged cache may hold sequences longer than the model's max_seq_len (chapter 4's calibration)."""
    config = ModelConfig(max_seq_len=16)
    table = RotaryTable(config)
    positions = torch.tensor([[3, 40]])  # (batch, seq): one inside, one past the table
    cos, sin = table.lookup(positions)
    want_cos, want_sin = rotary_cos_sin(positions, rotary_inv_freq(config.head_dim, config.rope_theta, "cpu"))
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    assert table.tables("cpu")[0].shape[0] >= 41


def test_signed_lookup_is_cos_and_sin_with_its_first_half_negated():
    config = ModelConfig(max_seq_len=64)
    table = RotaryTable(config)
    positions = torch.tensor([[0, 5, 63], [1, 2, 3]])  # (batch, seq)
    cos, signed_sin = table.lookup_signed(positions)
    want_cos, want_sin = table.lookup(positions)
    half = config.head_dim // 2
    assert cos.shape == signed_sin.shape == (2, 1, 3, config.head_dim)
    assert torch.equal(cos, want_cos)
    assert torch.equal(signed_sin[..., :half], -want_sin[..., :half])
    assert torch.equal(signed_sin[..., half:], want_sin[..., half:])


def test_signed_lookup_past_the_table_grows_it_with_the_same_rows():
    config = ModelConfig(max_seq_len=16)
    table = RotaryTable(config)
    table.lookup_signed(torch.tensor([[3]]))  # builds the table of 16 positions
    cos, _ = table.lookup_signed(torch.tensor([[3, 40]]))  # past it: the gather raises, the table grows
    want_cos, _ = rotary_cos_sin(torch.tensor([[3, 40]]), rotary_inv_freq(config.head_dim, config.rope_theta))
    assert torch.equal(cos, want_cos)


def test_the_signed_rotation_equals_apply_rotary_to_rounding():
    config = ModelConfig(max_seq_len=256)
    table = RotaryTable(config)
    positions = torch.arange(200)[None]  # (1, 200)
    x = torch.randn(1, 6, 200, config.head_dim, generator=torch.Generator().manual_seed(0))
    # a transposed view, as the lean pass rotates its projection's heads
    x = x.transpose(1, 2).contiguous().transpose(1, 2)
    want = apply_rotary(x, *table.lookup(positions))
    got = rotate_signed_into(x, *table.lookup_signed(positions), torch.empty(x.shape), torch.empty(x.shape))
    assert got.shape == want.shape and got.dtype == x.dtype
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()


def test_the_in_place_rotation_and_lookup_equal_the_allocating_ones_exactly():
    """rotate_signed_into and lookup_signed(out=) (the lean decode step's) compute the same numbers."""
    config = ModelConfig(max_seq_len=64)
    table = RotaryTable(config)
    positions = torch.tensor([[7], [30], [2]])  # (batch, 1): a decode step
    angles = torch.full((3, 2 * config.head_dim), float("nan"))
    cos, sin = table.lookup_signed(positions, out=angles)
    want_cos, want_sin = table.lookup_signed(positions)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    assert cos.data_ptr() == angles.data_ptr()  # a view of the given buffer
    x = torch.randn(3, 6, 1, config.head_dim, generator=torch.Generator().manual_seed(1))
    out, rolled = torch.empty_like(x), torch.empty_like(x)
    assert rotate_signed_into(x, cos, sin, out, rolled) is out
    half = config.head_dim // 2
    assert torch.equal(out, torch.addcmul(x * cos, x.roll(half, -1), sin))  # the allocating way
    far = torch.tensor([[3], [100], [1]])  # past the table's 64 positions: the gather raises, it grows
    far_cos, far_sin = table.lookup_signed(far, out=angles)
    want_cos, want_sin = table.lookup_signed(far)
    assert torch.equal(far_cos, want_cos) and torch.equal(far_sin, want_sin)
