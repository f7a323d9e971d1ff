"""Units and integer arithmetic that every layer of kvlib shares: binary byte units, sizes
written as text (``512MiB``), and ceiling division (blocks for tokens, bytes for bits).

Everything here is plain Python with no dependencies, so that any module may import it.
"""

from __future__ import annotations

import re

from kvlib import KVLibError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?|[KMG])?\s*$", re.IGNORECASE)

_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB}


def parse_bytes(text: str, what: str = "size") -> int:
    """``"536870912"``, ``"512MiB"``, ``"512M"`` or ``"32K"`` in bytes (binary units); else a KVLibError."""
    match = _SIZE.match(str(text))
    if not match or int(match.group(1)) <= 0:
        raise KVLibError(f"{what} must be a positive size in bytes such as 536870912 or 512MiB, not {text!r}")
    return int(match.group(1)) * _UNITS[(match.group(2) or "")[:1].upper()]


def ceil_div(a: int, b: int) -> int:
    """The smallest integer >= a / b, for integers a >= 0 and b > 0, exactly (no floats).

    Used wherever something comes in whole units: blocks for tokens (``ceil_div(17, 16) == 2``),
    bytes for bits, groups for values, MiB for bytes.
    """
    return -(-a // b)
