"""kvlib: the small library behind *kvbook*, a book about the KV cache of transformers.

Two houses. The library holds the concepts, one per package, each package's docstring listing its
modules; imports point down this list:

- ``units``, ``gpus``: byte units and ceiling division; GPU data sheets.
- ``measure``: the one timer, the hardware read rather than assumed (and the banner), the probes.
- ``sizing``: how big a cache is, for any model as the Hub publishes it, per GPU under tensor and
  pipeline parallelism, and as vLLM allocates it; pure arithmetic.
- ``kernels``: decode attention through block tables (PyTorch, numba on a CPU, Triton on CUDA).
- ``quant``: quantized KV storage (int8/int4/int2 min-max, fp8, KIVI).
- ``model``: a tiny Llama (and its lean decode pass), attention variants, an encoder-decoder,
  fewer K/V heads by pooling, the ``transformers`` bridge.
- ``cache``: contiguous caches, quantized and evicting caches, greedy generation.
- ``paged``: blocks, block tables, copy-on-write, prefix caching, the paged cache and decode loop.
- ``serving``: traces, memory policies, the scheduler, step-time models, the simulator, a real
  engine, speculative decoding, latency metrics.
- ``train``, ``quality``: the model chapter 7 trains, and how a cache's quality cost is scored.
- ``exercises``: how a reader's answer is judged (the helpers every chapter's checks share).
- ``checks``: the one copy of each argument check every public edge runs (counts, real numbers,
  token ids and tensors, sequence ids, a cache's new tokens).

The chapters' own code lives above the library, in ``chapters`` (one package per chapter: its
experiments, its bench section, its exercises); ``plotting`` draws every figure (the only importer
of matplotlib) and ``cli`` is ``python -m kvlib`` (``env``, ``size``, ``capacity``, ``bench``,
``train``). Importing kvlib changes nothing outside it.
"""

__version__ = "0.1.0"


class KVLibError(ValueError):
    """Bad input to kvlib: the message names the problem in one line."""
