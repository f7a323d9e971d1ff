"""How big the KV cache is, for any model on any GPU (chapter 2; chapters 3 to 6 reuse it).

Pure arithmetic on integers: nothing here imports torch (only :mod:`kvlib.units` of the rest
of kvlib), so the sizes are exact and every later layer can use them.

- ``dtypes``: the storage formats of K and V (fp32 ... int4 with its scales) and the bytes of
  one stored vector.
- ``spec``: :class:`ModelSpec` (what the cache of a model depends on) and the byte formulas,
  ``2 x layers x kv_heads x head_dim x tokens x batch x bytes`` and the five ways real
  models bend it (GQA/MQA, sliding windows, hybrids, MLA, encoder-decoders).
- ``layer_groups``: a layer stack as repeated patterns (no size loops over layers).
- ``config_keys``, ``layer_pattern``, ``config_reader``: a Hugging Face ``config.json`` to a
  :class:`ModelSpec` (every layer-pattern spelling; unknown size-relevant keys refused).
- ``parallel``: one GPU's cache under tensor and pipeline parallelism, as vLLM lays it out.
- ``catalog``: the real models shipped in ``configs/`` (each quoting its source), their
  table, and their export as JSON for the browser.
- ``capacity``: weights, free memory, largest batch and context on one GPU, and the report
  of ``python -m kvlib size``.
- ``deployment``: :class:`Deployment`, the nine numbers of one model served on one or more GPUs
  (model, context, batch, KV and weight dtypes, GPU memory, overhead, TP and PP sizes), checked once.
- ``widget``: the notebook's ipywidgets calculator and its static table.
- ``web_calculator``: the calculator of the online book, as HTML plus ``web/calculator.js``.
"""
