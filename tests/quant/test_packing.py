"""Tests of kvlib.quant.packing: codes pack at their width and unpack exactly."""

import pytest
import torch

from kvlib import KVLibError
from kvlib.quant.packing import pack_codes, unpack_codes


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("length", [1, 3, 7, 128, 129])
def test_every_code_unpacks_exactly_in_ceil_length_bits_over_8_bytes(bits, length):
    g = torch.Generator().manual_seed(bits * 1000 + length)
    codes = torch.randint(0, 2**bits, (3, 5, length), generator=g, dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (3, 5, -(-length * bits // 8))  # e.g. 129 int4 codes: 65 bytes
    assert torch.equal(unpack_codes(packed, bits, length), codes)


def test_the_lowest_bits_hold_the_first_code():
    # int4: codes 1, 2 -> 1 + 2 * 16 = 33; int2: 1, 2, 3, 0 -> 1 + 2*4 + 3*16 = 57
    assert pack_codes(torch.tensor([1, 2], dtype=torch.uint8), 4).tolist() == [33]
    assert pack_codes(torch.tensor([1, 2, 3, 0], dtype=torch.uint8), 2).tolist() == [57]
    assert pack_codes(torch.tensor([15, 15, 3], dtype=torch.uint8), 4).tolist() == [255, 3]


@pytest.mark.parametrize("bits", [0, 1, 3, 16])
def test_other_widths_are_refused(bits):
    with pytest.raises(KVLibError, match="bits must be one of"):
        pack_codes(torch.zeros(4, dtype=torch.uint8), bits)


def test_codes_must_be_bytes():
    with pytest.raises(KVLibError, match="uint8"):
        pack_codes(torch.zeros(4, dtype=torch.int32), 4)
