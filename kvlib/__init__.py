"""kvlib: the small library behind *kvbook*, a book about the KV cache of transformers.

One concept per module:

- ``measure``   timing, hardware banner, memory-bandwidth probe (every measuring chapter)
- ``model``     a tiny Llama-style decoder and its three ways to generate (chapter 1)
- ``sizing``    exact KV-cache byte counts for real models (chapter 2)
- ``paged``     block pool, block tables, copy-on-write, prefix caching (chapter 3)
- ``serving``   continuous batching under a memory budget (chapter 4)

Run ``python -m kvlib --help`` for the command line.
"""

__version__ = "0.1.0"


class KVLibError(ValueError):
    """Bad input to kvlib: the message names the problem in one line."""
