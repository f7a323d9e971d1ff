"""kvlib: the small library behind *kvbook*, a book about the KV cache of transformers.

One concept per module, grouped by the chapter that introduces it:

- measuring (chapter 0, every measuring chapter): ``measure`` (timer, hardware banner,
  bandwidth probe, thread control), ``plotting`` (figures), ``cli`` (``python -m kvlib``)
- chapter 1, why a cache: ``model`` (a tiny Llama), ``cache`` (contiguous caches),
  ``generate`` (three ways to decode), ``nocache`` (the measurement), ``costmodel``
  (counting FLOPs), ``article`` (the article's NumPy experiment), ``encdec``
  (cross-attention), ``hf`` (against transformers)
- chapter 2, how big: ``sizing`` (byte counts, configs, capacity; data in ``catalog/``),
  ``sizecheck`` (the formula against real tensors), ``attention`` (MHA/GQA/MQA),
  ``decode`` (why fewer KV heads decode faster), ``calculator`` and ``webcalc`` (the
  calculator in a notebook and in the online book)
- chapter 3, paging: ``paged_pool`` (blocks, reference counts, prefix cache), ``paged``
  (block tables, copy-on-write), ``paged_attention`` (kernel and paged cache),
  ``paged_measure`` (equality, overhead, waste)
- chapter 4, serving: ``traces``, ``placement`` (max/pow2/oracle/paged), ``serving``
  (scheduler), ``simulator``, ``engine`` (the real engine), ``sharing``,
  ``serving_measure``
- chapter 5 and the reference pages: ``levers`` (the levers together), ``troubleshoot``
  (the troubleshooting page), ``exercises`` (checks for every chapter's exercises)

Run ``python -m kvlib --help`` for the command line.
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
