"""Tests of kvlib.units: sizes written as text and ceiling division."""

import pytest

from kvlib import KVLibError, units


@pytest.mark.parametrize(
    "text, expected",
    [
        ("536870912", 512 << 20),
        ("512MiB", 512 << 20),
        ("512M", 512 << 20),
        ("32K", 32 << 10),
        ("1GiB", 1 << 30),
        (" 2 g ", 2 << 30),
    ],
)
def test_parse_bytes(text, expected):
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-5", "0", "1.5GiB", "12TB"])
def test_parse_bytes_rejects_nonsense_in_one_line(text):
    with pytest.raises(KVLibError, match="KVBOOK_LLC_BYTES must be a positive size"):
        units.parse_bytes(text, "KVBOOK_LLC_BYTES")


@pytest.mark.parametrize(
    "a, b, expected", [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2), (10**30 + 1, 10**15, 10**15 + 1)]
)
def test_ceil_div_rounds_up_exactly(a, b, expected):
    assert units.ceil_div(a, b) == expected


def test_byte_units_are_binary():
    assert (units.KiB, units.MiB, units.GiB) == (1 << 10, 1 << 20, 1 << 30)
