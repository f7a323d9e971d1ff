"""Rotary position embeddings (RoPE) as Llama computes them (chapters 1-3).

Each pair of a head's dimensions is rotated by an angle proportional to the token's
position, so that the score of a query and a key depends on their distance. Positions come
from the cache (:meth:`~kvlib.model.config.KVCache.prepare`), so a decode step rotates only
the new token's query and key; stored keys are kept rotated. The convention (pairs
``i, i + head_dim / 2``, float32 angles) is ``transformers``' Llama's, so that the logits of
:mod:`kvlib.model.hf`'s comparison agree.

A decode step needs the angles of one position per sequence. Computing them costs a dozen
small operations per step; :class:`RotaryTable` computes every position's once, up to
``max_seq_len``, and a step looks its rows up (one gather each for cos and sin), as
``transformers`` and vLLM do with their cos/sin caches.

The lean forward pass (:mod:`kvlib.model.lean`) rotates with :func:`rotate_signed_into`: the same
rotation as :func:`apply_rotary` in four operators that allocate nothing, from one gather of a
table that holds cos beside a *signed* sin (its first half negated, :meth:`RotaryTable.lookup_signed`),
so that a step needs no ``torch.cat`` and no negation.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from kvlib import KVLibError
from kvlib.model.config import KVCache, ModelConfig


def rotary_inv_freq(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """Angular speed of each of the head_dim / 2 rotated pairs (Llama's default RoPE), float32."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles for (batch, seq) positions: each (batch, 1, seq, head_dim).

    The angles are float32 whatever the model's dtype, as in transformers: in 16 bits, the
    angle of a position in the thousands would already be off by a large fraction of a turn.
    """
    angles = positions.float()[..., None] * inv_freq  # (batch, seq, head_dim / 2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (batch, 1, seq, head_dim)
    return angles.cos(), angles.sin()


class RotaryTable:
    """cos and sin of the rotary angles of positions 0 .. max_seq_len - 1, computed once per device.

    The rows are what :func:`rotary_cos_sin` gives for each position (the same float32
    arithmetic, elementwise), so looking them up changes no result. The table lives outside
    the model's parameters and buffers: ``model.half()`` must not round the angles, and the
    state dict stays Hugging Face's. It is built on first use on each device.
    """

    def __init__(self, config: ModelConfig):
        self.max_seq_len = config.max_seq_len
        self.head_dim = config.head_dim
        self.theta = config.rope_theta
        # device -> (cos, sin), each (max_seq_len, head_dim) float32
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        # device -> (max_seq_len, 2 * head_dim) float32: [cos | sin with its first half negated]
        self._signed: dict[torch.device, torch.Tensor] = {}

    def tables(self, device, num_positions: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions 0 .. n - 1 on ``device``, each (n, head_dim), built once.

        n is ``max_seq_len``, or more when a caller asks for ``num_positions`` beyond it (a paged
        cache may hold longer sequences than the model was configured for); the table then
        grows, with the same rows for the positions it already had.
        """
        device = torch.device(device)
        have = self._tables.get(device)
        if have is None or have[0].shape[0] < num_positions:
            length = max(self.max_seq_len, num_positions, 2 * have[0].shape[0] if have else 0)
            positions = torch.arange(length, device=device)[None]  # (1, length)
            cos, sin = rotary_cos_sin(positions, rotary_inv_freq(self.head_dim, self.theta, device))
            self._tables[device] = (cos[0, 0], sin[0, 0])  # each (length, head_dim)
        return self._tables[device]

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for (batch, seq) positions, each (batch, 1, seq, head_dim): rows of the table.

        A position past the table grows it (see :meth:`tables`).
        """
        cos, sin = self.tables(positions.device)
        if positions.numel() and int(positions.max()) >= cos.shape[0]:
            cos, sin = self.tables(positions.device, int(positions.max()) + 1)
        return F.embedding(positions, cos)[:, None], F.embedding(positions, sin)[:, None]

    def lookup_signed(
        self, positions: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the signed sin for (batch, seq) positions, each (batch, 1, seq, head_dim), one gather.

        The signed sin is ``sin`` with its first half negated, what :func:`rotate_signed_into` multiplies
        the swapped halves by. Both are views of one gathered (batch, 1, seq, 2 * head_dim) tensor,
        written into ``out`` (batch * seq, 2 * head_dim) if given. A position past the table grows
        it; on the CPU the gather itself finds such a position (it raises ``IndexError``), which
        spares a step reading the largest position back.
        """
        table = self._signed.get(positions.device)
        if table is None or positions.device.type != "cpu":
            table = self._signed_table(positions)
        try:
            rows = self._gather(table, positions, out)  # (batch, seq, 2 * head_dim)
        except IndexError:
            rows = self._gather(self._signed_table(positions), positions, out)
        return rows[:, None].chunk(2, dim=-1)

    @staticmethod
    def _gather(table: torch.Tensor, positions: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """Rows of ``table`` at positions (batch, seq): (batch, seq, width), in ``out`` if given."""
        if out is None or out.shape[0] != positions.numel():  # a cache may give (1, seq) for the batch
            return torch.embedding(table, positions)
        torch.index_select(table, 0, positions.reshape(-1), out=out)  # a decode step's positions: a view
        return out.view(*positions.shape, -1)

    def _signed_table(self, positions: torch.Tensor) -> torch.Tensor:
        """The (length, 2 * head_dim) table [cos | signed sin] on positions' device, long enough for them."""
        device, needed = positions.device, int(positions.max()) + 1 if positions.numel() else 0
        table = self._signed.get(device)
        if table is None or table.shape[0] < needed:
            cos, sin = self.tables(device, needed)
            half = self.head_dim // 2
            table = torch.cat([cos, -sin[:, :half], sin[:, half:]], dim=-1)  # (length, 2 * head_dim)
            self._signed[device] = table
        return table


def new_token_positions(tokens: torch.Tensor, cache: KVCache | None, config: ModelConfig) -> torch.Tensor:
    """Positions (batch, seq) of the tokens (batch, seq) of a forward pass: those the cache gives
    them (:meth:`~kvlib.model.config.KVCache.prepare`), or 0 .. seq-1 without a cache."""
    batch, seq = tokens.shape
    if cache is not None:
        return cache.prepare(seq)
    if seq > config.max_seq_len:
        raise KVLibError(f"sequence of {seq} tokens is longer than max_seq_len ({config.max_seq_len})")
    return torch.arange(seq, device=tokens.device).expand(batch, seq)


def new_token_rotary(
    tokens: torch.Tensor, cache: KVCache | None, config: ModelConfig, table: RotaryTable | None = None
):
    """cos and sin for the tokens (batch, seq) of a forward pass: at the positions the cache
    gives them, or at 0 .. seq-1 when there is no cache and the tokens are the whole sequence.

    With a ``table`` (:class:`RotaryTable`) the angles are looked up, else computed.
    """
    positions = new_token_positions(tokens, cache, config)
    if table is not None:
        return table.lookup(positions)
    return rotary_cos_sin(positions, rotary_inv_freq(config.head_dim, config.rope_theta, tokens.device))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + head_dim/2) of x (batch, heads, seq, head_dim) by the angles."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def rotate_signed_into(
    x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, out: torch.Tensor, rolled: torch.Tensor
) -> torch.Tensor:
    """:func:`apply_rotary` written into ``out``: x * cos + (x with its halves swapped) * signed_sin.

    The lean decode step's rotation (chapter 1). x: (batch, heads, seq, head_dim), of any strides
    (the lean pass rotates the query and key heads of one projection together); cos, signed_sin
    from :meth:`RotaryTable.lookup_signed`; ``out`` and ``rolled`` (scratch) of x's shape and
    dtype, contiguous. Swapping the halves gives (x2, x1), and the signed sin turns it into
    :func:`apply_rotary`'s (-x2, x1) * sin exactly; ``addcmul`` then adds the product with one
    rounding, where :func:`apply_rotary` rounds twice, so the two agree to float32 rounding.
    Four operators, none allocating (``roll`` has no ``out=``, so the halves are swapped by two
    copies).
    """
    half = x.shape[-1] // 2
    rolled[..., :half].copy_(x[..., half:])
    rolled[..., half:].copy_(x[..., :half])
    torch.mul(x, cos, out=out)
    return out.addcmul_(rolled, signed_sin)  # (batch, heads, seq, head_dim)
