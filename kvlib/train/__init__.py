"""Training the model chapter 7 measures: its corpus, its training loop, its shipped weights (chapter 7).

- ``corpus``: generated documents with a retrieval probe (nothing downloaded).
- ``trainer``: :data:`QUALITY_MODEL`, :class:`TrainConfig` and :func:`train`, the seeded loop.
- ``checkpoint``: safetensors files with config, training record and checksum (``weights/``).
- ``command``: ``python -m kvlib train``.

Above :mod:`kvlib.model` (the model it trains); :mod:`kvlib.quality` reads it.
"""

from kvlib.train.checkpoint import WEIGHTS_DIR, load_model, model_info, save_model
from kvlib.train.corpus import CorpusConfig, Documents, decode, documents
from kvlib.train.trainer import QUALITY_MODEL, TrainConfig, TrainResult, WholeSequence, learning_rate, train

__all__ = [
    "QUALITY_MODEL",
    "WEIGHTS_DIR",
    "CorpusConfig",
    "Documents",
    "TrainConfig",
    "TrainResult",
    "WholeSequence",
    "decode",
    "documents",
    "learning_rate",
    "load_model",
    "model_info",
    "save_model",
    "train",
]
