"""How the block manager checks its arguments: sequence ids, indices and token ids (chapter 3).

A block table is plain Python bookkeeping, so a bad argument (a float block id, a negative
token, an unhashable sequence id) would be stored and fail far away, or silently read the
wrong block through Python's negative indices. Each check here turns such a value into a
one-line :class:`~kvlib.KVLibError` naming it. :mod:`kvlib.paged.block_manager` runs them.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from kvlib import KVLibError


def check_seq_id(seq_id) -> None:
    """A sequence id is a dict key: a list or another unhashable value is a KVLibError, not a TypeError."""
    try:
        hash(seq_id)
    except TypeError:
        raise KVLibError(
            f"a sequence id must be hashable (an int or a string), not {seq_id!r}"[:200]
        ) from None


def checked_token_ids(token_ids: Sequence[int]) -> Sequence[int]:
    """``token_ids`` itself, once it is checked to be a sequence (a list or tuple the manager can
    index and read again later, not a generator or a string) of non-negative integers, at least one."""
    if isinstance(token_ids, str | bytes) or not isinstance(token_ids, Sequence):
        raise KVLibError(
            f"token ids must be a list or tuple of integers, not {type(token_ids).__name__} {token_ids!r}"[
                :200
            ]
        )
    try:
        values = [operator.index(t) for t in token_ids]
    except TypeError:
        raise KVLibError(f"token ids must be integers, not {token_ids!r}"[:200]) from None
    if not values:
        raise KVLibError("a sequence needs at least one token")
    if min(values) < 0:
        raise KVLibError(f"token ids must be non-negative, not {min(values)}")
    return token_ids
