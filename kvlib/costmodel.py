"""Counting the work of generation with and without a KV cache (chapter 1).

:func:`forward_flops` counts the floating-point operations of one forward pass of
:class:`~kvlib.model.TinyLlama` (a multiply-add is 2 FLOPs), split into the K/V
projections, the other attention projections (Q and O), the attention itself and the
MLP, plus the output projection of the last position. :func:`step_flops` applies it to
every step of a greedy generation: without a cache, step t runs the model over all t
tokens; with one, over the newest token only, against t stored keys.

A FLOP count predicts a speedup of about n / 2 at n tokens, far more than a small model
shows. :func:`fit_step_time` adds the missing term, a fixed cost per step (launching
the operations and reading every weight once): step time = overhead + FLOPs / rate.
:func:`growth_exponent` fits how total time grows with length on a log-log scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlib import KVLibError
from kvlib.model import ModelConfig

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


def step_flops(config: ModelConfig, num_new: int, cached: bool, prompt_len: int = 1, batch: int = 1) -> np.ndarray:
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
    return float(step_flops(config, num_new, False, prompt_len).sum() / step_flops(config, num_new, True, prompt_len).sum())


@dataclass(frozen=True)
class StepTimeModel:
    """step seconds = overhead_s + FLOPs / flops_per_s, fitted to measured steps."""

    overhead_s: float
    flops_per_s: float

    def predict(self, flops: np.ndarray) -> np.ndarray:
        return self.overhead_s + np.asarray(flops) / self.flops_per_s

    def speedup(self, flops_slow: np.ndarray, flops_fast: np.ndarray) -> float:
        """Predicted total time of the slow steps over that of the fast steps."""
        return float(self.predict(flops_slow).sum() / self.predict(flops_fast).sum())


def fit_step_time(flops: np.ndarray, seconds: np.ndarray) -> StepTimeModel:
    """Least-squares fit of seconds = overhead + flops / rate over many measured steps.

    The fit is weighted by 1 / seconds (a relative error per step), so that the many
    short steps count as much as the few long ones.
    """
    flops, seconds = np.asarray(flops, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if flops.shape != seconds.shape or flops.size < 2 or np.ptp(flops) == 0:
        raise KVLibError("fit_step_time needs matching arrays of at least two steps with different FLOPs")
    weights = 1.0 / seconds
    design = np.stack([np.ones_like(flops), flops], axis=1) * weights[:, None]
    (overhead, seconds_per_flop), *_ = np.linalg.lstsq(design, seconds * weights, rcond=None)
    if seconds_per_flop <= 0:
        raise KVLibError("the measured step times do not grow with FLOPs; cannot fit a rate")
    return StepTimeModel(float(overhead), float(1.0 / seconds_per_flop))


def growth_exponent(lengths, totals) -> float:
    """Slope k of log(total) = k log(length) + c: total time grows like length^k."""
    x, y = np.log(np.asarray(lengths, dtype=np.float64)), np.log(np.asarray(totals, dtype=np.float64))
    if x.size < 2 or not np.all(np.isfinite(y)):
        raise KVLibError("growth_exponent needs at least two lengths with positive totals")
    return float(np.polyfit(x, y, 1)[0])


def plot_growth(lengths, totals: dict, exponents: dict):
    """Total generation time against length on log-log axes, one line per way, with fitted slopes."""
    from kvlib.plotting import axes

    fig, ax = axes("Total time grows like length^k", "generated tokens", "seconds in total", logx=True, logy=True)
    for (name, values), color in zip(totals.items(), ("C3", "C0", "C1")):
        ax.plot(lengths, values, "o-", color=color, label=f"{name}: k = {exponents[name]:.2f}")
    ax.legend()
    return fig
