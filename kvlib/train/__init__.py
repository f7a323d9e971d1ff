"""Training the model chapter 7 measures: its corpus, its training loop, its shipped weights (chapter 7).

- ``corpus``: generated documents with a retrieval probe (nothing downloaded).
- ``trainer``: :data:`QUALITY_MODEL`, :class:`TrainConfig` and :func:`train`, the seeded loop.
- ``checkpoint``: safetensors files with config, training record and checksum (``weights/``).

Above :mod:`kvlib.model` (the model it trains); :mod:`kvlib.quality` reads it; the command
``python -m kvlib train`` is :mod:`kvlib.cli.train`.
"""
