"""Counting the work of generation with and without a KV cache (chapter 1).

:func:`forward_flops` counts the floating-point operations of one forward pass of
:class:`~kvlib.model.llama.TinyLlama` (a multiply-add is 2 FLOPs), split into the K/V
projections, the other attention projections (Q and O), the attention itself and the
MLP, plus the output projection of the last position. :func:`step_flops` applies it to
every step of a greedy generation: without a cache, step t runs the model over all t
tokens; with one, over the newest token only, against t stored keys.

A FLOP count predicts a speedup of about n / 2 at n tokens, far more than a small model
shows. :func:`fit_flop_time` adds the missing term, a fixed cost per step (launching
the operations and reading every weight once): step time = overhead + FLOPs / rate, and
:func:`overhead_for_speedup` says how large that fixed cost must be for a given speedup.
:func:`growth_exponent` fits how total time grows with length on a log-log scale.

:func:`concat_copy_table` asks when the concatenation trap matters for real models: a
decode step reads every weight once and the whole cache, whatever the cache does, and a
cache grown by concatenation also reads and writes the whole cache again. The table gives
the context at which that copy reaches a given share of the bytes the step reads anyway,
exactly, from the catalog's configurations and parameter counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from kvlib import KVLibError
from kvlib.checks import is_int
from kvlib.model.config import ModelConfig
from kvlib.units import ceil_div

PARTS = ("kv_proj", "qo_proj", "attention", "mlp", "lm_head")


def forward_flops(config: ModelConfig, num_new: int, num_keys: int, batch: int = 1) -> dict[str, int]:
    """FLOPs of one pass over ``num_new`` tokens that attend to ``num_keys`` keys, per part.

    The attention counts every score it computes: our attention forms the full
    (num_new x num_keys) score matrix and masks the future, as most simple
    implementations do. Only the last position goes through the output projection.
    """
    if num_new < 1 or num_keys < num_new:
        raise KVLibError(f"need 1 <= num_new <= num_keys, not num_new={num_new}, num_keys={num_keys}")
    c, d = config, config.d_model
    q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = {
        "kv_proj": 2 * num_new * d * 2 * kv_width,
        "qo_proj": 2 * num_new * d * q_width * 2,
        "attention": 2 * 2 * c.num_heads * c.head_dim * num_new * num_keys,  # Q K^T and weights @ V
        "mlp": 2 * num_new * 3 * d * c.d_ff,
    }
    flops = {part: batch * c.num_layers * value for part, value in per_layer.items()}
    flops["lm_head"] = batch * 2 * d * c.vocab_size
    return flops


def step_flops(
    config: ModelConfig, num_new: int, cached: bool, prompt_len: int = 1, batch: int = 1
) -> np.ndarray:
    """FLOPs of each of the ``num_new`` steps of greedy generation, (num_new,).

    Without a cache, step i runs over all prompt_len + i tokens; with one, the first step
    processes the prompt and each later step one token against prompt_len + i keys.
    """
    total = []
    for i in range(num_new):
        length = prompt_len + i
        num_tokens = length if (not cached or i == 0) else 1
        total.append(sum(forward_flops(config, num_tokens, length, batch).values()))
    return np.array(total, dtype=np.float64)


def flop_ratio(config: ModelConfig, num_new: int, prompt_len: int = 1) -> float:
    """Total FLOPs without a cache over total FLOPs with one: what a pure work count predicts."""
    return float(
        step_flops(config, num_new, False, prompt_len).sum()
        / step_flops(config, num_new, True, prompt_len).sum()
    )


@dataclass(frozen=True)
class FlopTimeModel:
    """step seconds = overhead_s + FLOPs / flops_per_s, fitted to measured steps."""

    overhead_s: float  # fixed seconds per step: launching the operations, reading every weight
    flops_per_s: float  # the fitted rate of the arithmetic

    def predict(self, flops: np.ndarray) -> np.ndarray:
        """Predicted seconds of steps that do ``flops`` FLOPs each."""
        return self.overhead_s + np.asarray(flops) / self.flops_per_s

    def speedup(self, flops_slow: np.ndarray, flops_fast: np.ndarray) -> float:
        """Predicted total time of the slow steps over that of the fast steps."""
        return float(self.predict(flops_slow).sum() / self.predict(flops_fast).sum())


def fit_flop_time(flops: np.ndarray, seconds: np.ndarray) -> FlopTimeModel:
    """Least-squares fit of seconds = overhead + flops / rate over many measured steps.

    The fit is weighted by 1 / seconds (a relative error per step), so that the many
    short steps count as much as the few long ones.
    """
    flops, seconds = np.asarray(flops, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if flops.shape != seconds.shape or flops.size < 2 or np.ptp(flops) == 0:
        raise KVLibError("fit_flop_time needs matching arrays of at least two steps with different FLOPs")
    weights = 1.0 / seconds
    design = np.stack([np.ones_like(flops), flops], axis=1) * weights[:, None]
    (overhead, seconds_per_flop), *_ = np.linalg.lstsq(design, seconds * weights, rcond=None)
    if seconds_per_flop <= 0:
        raise KVLibError("the measured step times do not grow with FLOPs; cannot fit a rate")
    return FlopTimeModel(float(overhead), float(1.0 / seconds_per_flop))


def overhead_for_speedup(
    config: ModelConfig, num_new: int, speedup: float, prompt_len: int = 1, batch: int = 1
) -> float:
    """The fixed cost per step, counted in FLOPs at the arithmetic rate (overhead_s x flops_per_s),
    at which overhead + FLOPs / rate predicts exactly ``speedup`` over ``num_new`` steps.

    With o x r = w, the prediction is (n w + F_none) / (n w + F_cache) (FLOPs summed over the n
    steps, :func:`step_flops`); it equals s at w = (F_none - s F_cache) / ((s - 1) n), and falls
    below s for any larger fixed cost. Exact arithmetic on the FLOP counts.
    """
    if not speedup > 1:
        raise KVLibError(f"speedup must exceed 1 (a cache that saves something), not {speedup!r}")
    none = step_flops(config, num_new, False, prompt_len, batch).sum()
    cached = step_flops(config, num_new, True, prompt_len, batch).sum()
    if none <= speedup * cached:
        raise KVLibError(
            f"the FLOP ratio {none / cached:.3g} does not reach {speedup}: no fixed cost gives it"
        )
    return float((none - speedup * cached) / ((speedup - 1) * num_new))


def growth_exponent(lengths, totals) -> float:
    """Slope k of log(total) = k log(length) + c: total time grows like length^k."""
    x, y = np.log(np.asarray(lengths, dtype=np.float64)), np.log(np.asarray(totals, dtype=np.float64))
    if x.size < 2 or not np.all(np.isfinite(y)):
        raise KVLibError("growth_exponent needs at least two lengths with positive totals")
    return float(np.polyfit(x, y, 1)[0])


# Dense models of the catalog whose every layer caches the full context: for these a decode
# step reads all the weights and the whole cache, which the table below counts exactly.
DENSE_FULL_ATTENTION = (
    "Llama-2-7B",
    "Llama-3-8B",
    "Qwen2.5-7B",
    "Falcon-7B",
    "OPT-13B",
    "Llama-2-70B",
    "Llama-3-70B",
)


def concat_copy_share(weight_bytes: int, cache_bytes: int) -> Fraction:
    """Bytes a concatenating cache moves in one decode step, over the bytes the step reads anyway.

    The step reads every weight once and the whole cache for attention: weights + cache.
    Concatenation reads the whole cache again and writes it to a new tensor: 2 x cache
    (a lower bound: a CPU also reads the destination's lines before writing them). Exact.
    """
    for key, value in (("weight_bytes", weight_bytes), ("cache_bytes", cache_bytes)):
        if not is_int(value) or value < 0:
            raise KVLibError(f"{key} must be a non-negative integer, not {value!r}")
    if weight_bytes + cache_bytes == 0:
        raise KVLibError("a step that reads nothing has no share")
    return Fraction(2 * cache_bytes, weight_bytes + cache_bytes)


def concat_copy_tokens(
    weight_bytes: int, bytes_per_token: int, batch: int = 1, share: Fraction = Fraction(1, 10)
) -> int:
    """The shortest context at which the copy reaches ``share`` of what a step reads anyway.

    With a cache of C = context x bytes_per_token x batch, 2C >= share x (weights + C)
    holds from C >= share x weights / (2 - share) on: the smallest such whole context.
    """
    for key, value in (
        ("weight_bytes", weight_bytes),
        ("bytes_per_token", bytes_per_token),
        ("batch", batch),
    ):
        if not is_int(value) or value < 1:
            raise KVLibError(f"{key} must be a positive integer, not {value!r}")
    share = Fraction(share)
    if not 0 < share < 2:
        raise KVLibError(
            f"share must lie between 0 and 2 (the copy moves at most twice what it adds), not {share}"
        )
    needed = share * weight_bytes / ((2 - share) * bytes_per_token * batch)
    return max(1, ceil_div(needed.numerator, needed.denominator))


def concat_copy_table(
    models=DENSE_FULL_ATTENTION,
    batches=(1, 32),
    context: int = 2048,
    share: Fraction = Fraction(1, 10),
    kv_dtype: str = "fp16",
    weight_dtype: str = "bf16",
) -> list[dict]:
    """Per model: bytes per token, weights, and when concatenating its cache matters (exact).

    For each batch: the context from which the copy moves at least ``share`` of the bytes a
    decode step reads anyway (:func:`concat_copy_tokens`), and the copy's share at
    ``context`` tokens (:func:`concat_copy_share`). Only dense models whose every layer
    caches the full context are accepted: a mixture of experts reads only its active
    experts' weights per token, and sliding windows or hybrid layers cap the cache.
    """
    from kvlib.sizing.capacity import weight_bytes
    from kvlib.sizing.catalog import catalog_entry
    from kvlib.sizing.spec import bytes_per_token

    rows = []
    for name in models:
        entry = catalog_entry(name)
        spec = entry.spec
        if any("expert" in key for key in entry.config):
            raise KVLibError(
                f"{entry.name} is a mixture of experts: a step reads only its active experts' weights"
            )
        if (
            spec.is_mla
            or spec.num_attention_layers != spec.num_layers
            or any(w is not None for w in spec.sliding_windows)
            or spec.cross_attention_tokens
        ):
            raise KVLibError(
                f"{entry.name} does not cache the full context in every layer; the table needs a dense model"
            )
        per_token, weights = bytes_per_token(spec, kv_dtype), weight_bytes(entry.num_parameters, weight_dtype)
        row = {
            "model": entry.name,
            "KV bytes/token": per_token,
            "weights (GB)": round(weights / 1e9, 2),
            "max context": spec.max_context,
        }
        percent = f"{float(share) * 100:g}%"
        for batch in batches:
            row[f"copy >= {percent} from (tokens), batch {batch}"] = concat_copy_tokens(
                weights, per_token, batch, share
            )
        for batch in batches:
            row[f"copy share at {context:,} tokens, batch {batch}"] = round(
                float(concat_copy_share(weights, context * per_token * batch)), 3
            )
        rows.append(row)
    return rows
