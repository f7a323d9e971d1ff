"""What one forward pass on the paged cache reads, in buffers kept from step to step (chapters 3 and 4).

Besides the K/V pools, a decode step of a batch reads each new token's id, position and pool
slot, and each sequence's block table and length; the greedy loop then needs the logits and
their argmax. The values change at every step, but the sizes only grow with the batch, so
:class:`StepInputs` keeps each in one tensor, grown (doubled) when a step needs more, and hands
out views of it. Integers computed in Python go in through a numpy view of a CPU buffer, so
without a PyTorch operator; on another device they are then copied into a buffer there, in
place. Like vLLM's ``InputBatch`` (persistent block tables and token ids, filled with numpy),
this is what lets a decode step allocate no tensor (chapter 1's lean step, on the paged cache).
A step's views are overwritten by the next step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvlib import KVLibError


class StepInputs:
    """Named buffers for one cache's forward passes, on ``device``, each grown to the largest step."""

    def __init__(self, device=None):
        self.device = torch.device(device or "cpu")
        self._host: dict[str, tuple[torch.Tensor, np.ndarray]] = {}  # int64 CPU buffers and their views
        self._device: dict[str, torch.Tensor] = {}  # on a non-CPU device: where put copies them
        self._scratch: dict[tuple[str, torch.dtype], torch.Tensor] = {}  # buffers the pass writes

    def put(self, name: str, values: Sequence[int]) -> torch.Tensor:
        """``values`` as a 1-D int64 tensor on the device: a view of buffer ``name``."""
        n = len(values)
        host, array = self._host.get(name, (None, None))
        if host is None or host.shape[0] < n:
            host = _empty(max(n, 2 * (0 if host is None else host.shape[0])), torch.long, "cpu")
            array = host.numpy()
            self._host[name] = (host, array)
        array[:n] = values
        host_view = host if host.shape[0] == n else host[:n]
        if self.device.type == "cpu":
            return host_view
        target = self._device.get(name)
        if target is None or target.shape[0] < n:
            target = self._device[name] = _empty(host.shape[0], torch.long, self.device)
        return (target if target.shape[0] == n else target[:n]).copy_(host_view, non_blocking=True)

    def put_rows(self, name: str, rows: Sequence[Sequence[int]], width: int, pad: int = 0) -> torch.Tensor:
        """Rows of at most ``width`` integers, padded with ``pad``: a (len(rows), width) int64 view."""
        if any(len(row) > width for row in rows):
            raise KVLibError(f"a row of {name} is longer than the width {width}")
        flat = [value for row in rows for value in (*row, *[pad] * (width - len(row)))]
        return self.put(name, flat).view(len(rows), width)

    def scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of ``shape`` on the device for a pass to write into (its values are whatever the
        last writer left): a view of buffer ``name``, grown when too small."""
        numel = int(np.prod(shape))
        buffer = self._scratch.get((name, dtype))
        if buffer is None or buffer.numel() < numel:
            buffer = _empty(max(numel, 2 * (0 if buffer is None else buffer.numel())), dtype, self.device)
            self._scratch[name, dtype] = buffer
        return (buffer if buffer.numel() == numel else buffer[:numel]).view(shape)


def _empty(numel: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised 1-D buffer that is an ordinary tensor, writable in any mode (made even
    under ``torch.inference_mode``, whose tensors cannot be written outside it)."""
    with torch.inference_mode(False):
        return torch.empty(numel, dtype=dtype, device=device)
