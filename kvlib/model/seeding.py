"""The one seeded initialisation of the book's models (chapters 1-3).

:class:`~kvlib.model.llama.TinyLlama` and :class:`~kvlib.model.encdec.EncoderDecoder` build
their layers inside :func:`seeded_weights`, so that the same ``ModelConfig.seed`` always gives
the same weights (the notebooks compare generated tokens, which depend on them), and building
a model leaves the caller's random stream untouched. :mod:`kvlib.model.hf` and
:mod:`kvlib.chapters.ch02_cache_size.size_check` build their ``transformers`` models inside it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def seeded_weights(seed: int) -> Iterator[None]:
    """Draw every weight created in the block from torch's CPU generator seeded with ``seed``.

    The global generator's state is saved before and restored after (``fork_rng``), so the
    draws of the caller before and after the block are the same as if no model had been built.
    Weights are drawn on the CPU whatever device the model later moves to, so every device
    gets the same model.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
