"""(from measure.py) How kvbook measures: one timer, one hardware banner, one bandwidth probe.

Every measuring chapter starts with ``print(hardware_report().banner())`` and times
through :func:`time_it`, so all numbers in the book are taken the same way:
warm-up calls first, CUDA synchronised around every sample, several repeats, and
the median reported with the min and max beside it. The chapter
"How to read the measurements" (``book/00_measurements.ipynb``) introduces them.

(from sizing.py) Exact KV-cache byte counts for real models (chapter 2).

The cache of one attention layer holds, for every cached token, one key and one value
vector per KV head, so the whole cache is

    bytes = 2 x num_attention_layers x num_kv_heads x head_dim x tokens x batch x bytes_per_value

(the formula of the source article of this book). Real models bend it in five ways,
all handled here from a single description, :class:`ModelSpec`:

- **GQA / MQA**: ``num_kv_heads`` below ``num_heads`` (MQA: one).
- **Sliding-window layers** (Mistral, Gemma-2): such a layer never caches more than its
  window, ``min(tokens, window)`` tokens.
- **Hybrid models** (Jamba): only some layers are attention layers; the others keep a
  fixed-size state and no KV cache.
- **MLA** (DeepSeek-V2/V3): each layer caches one latent vector of
  ``kv_lora_rank + qk_rope_head_dim`` values per token, shared by all heads, instead of
  K and V per head.
- **Encoder-decoder models** (Whisper): every decoder layer also caches the cross-attention
  K and V of all encoder positions, computed once per input and not growing with the output.

KV quantization is a :class:`KVDtype`: fp8 stores one byte per value (with one scale per
tensor, which we neglect); int8 and int4 store 8 or 4 bits per value plus, for every
group of ``group_size`` consecutive values of a vector (default 32), one fp16 scale and
one fp16 zero point (asymmetric min-max quantization, as in KIVI-style KV quantizers).

:func:`spec_from_config` builds a description from a Hugging Face ``config.json``;
``kvlib/catalog/*.json`` ships real models (each file quotes its config and its source).
"""

from __future__ import annotations

import re

from kvlib import KVLibError

MiB = 1 << 20

GiB = 1 << 30

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?|[KMG])?\s*$", re.IGNORECASE)

_UNITS = {"": 1, "K": 1 << 10, "M": MiB, "G": GiB}


def parse_bytes(text: str, what: str = "size") -> int:
    """``"536870912"``, ``"512MiB"``, ``"512M"`` or ``"32K"`` in bytes (binary units); else a KVLibError."""
    match = _SIZE.match(str(text))
    if not match or int(match.group(1)) <= 0:
        raise KVLibError(f"{what} must be a positive size in bytes such as 536870912 or 512MiB, not {text!r}")
    return int(match.group(1)) * _UNITS[(match.group(2) or "")[:1].upper()]
