"""kvlib: the small library behind *kvbook*, a book about the KV cache of transformers.

One concept per package; each package's docstring lists its modules. Imports point down:

- ``units``, ``gpus``: byte units and ceiling division; GPU data sheets (chapters 4, 5).
- ``measure``: timer, hardware facts and banner, bandwidth and FLOP probes (chapter 0).
- ``sizing``: how big a cache is, for any model as the Hub publishes it, per GPU under tensor
  and pipeline parallelism, and as vLLM allocates it; pure arithmetic (chapter 2).
- ``kernels``: decode attention through block tables: the PyTorch gather reference, the fused
  numba kernel (CPU) and the Triton kernel (CUDA), chosen per device (chapters 2, 3).
- ``quant``: quantized KV storage (int8/int4/int2 min-max, fp8, KIVI), for the quality chapter
  of issue 14 (not yet written).
- ``model``: a tiny Llama, attention variants, an encoder-decoder, the transformers bridge.
- ``cache``: contiguous caches, generation, FLOP counts, chapter 1's experiments and
  chapter 2's decode speed.
- ``paged``: blocks, block tables, copy-on-write, prefix caching, paged kernels (chapter 3).
- ``serving``: scheduler, memory policies, simulator, real engine (chapter 4).
- ``levers`` (chapter 5), ``troubleshoot`` (the troubleshooting page), ``exercises``.
- ``plotting``: every figure of the book (the only importer of matplotlib).
- ``cli``: ``python -m kvlib`` (``env``, ``size``, ``capacity``, ``bench``).
"""

__version__ = "0.1.0"


class KVLibError(ValueError):
    """Bad input to kvlib: the message names the problem in one line."""


def _show_whole_tables() -> None:
    """Let pandas print every column and whole strings: the book's tables must not be cut short."""
    try:
        import pandas
    except ImportError:  # kvlib itself does not need pandas
        return
    pandas.set_option("display.max_columns", None)
    pandas.set_option("display.max_colwidth", None)
    pandas.set_option("display.width", 250)


_show_whole_tables()
