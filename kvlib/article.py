"""The source article's cache experiment, redone in NumPy in our own code (chapter 1).

The article {cite}`kvarticle` times two loops over random weights with d_model 256 and
4 layers: one that recomputes the keys and values of every earlier token at each step,
and one that keeps them and appends the new token's. Its loops do the attention
arithmetic only: no softmax, no output projection, no MLP, and each layer reads the
same input instead of the previous layer's output. We keep that setup (so that the
numbers can be set beside the article's), with two differences: our inputs are drawn
once before the clock starts (the article draws fresh random inputs inside its timed
loops), and both loops return the last token's attention output, so that we can check
they compute the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from kvlib import KVLibError
from kvlib.measure import Timing, time_it

# The article's table (NumPy on a CPU, d_model 256, 4 layers): tokens -> (no cache s, cache s, speedup).
ARTICLE_FIGURES = {100: (0.208, 0.061, 3.4), 200: (0.558, 0.125, 4.5), 400: (2.076, 0.346, 6.0)}


@dataclass(frozen=True)
class ArticleSetup:
    """Random weights and inputs of the article's experiment (float64, NumPy's default)."""

    weights: list  # per layer: (W_q, W_k, W_v), each (d_model, d_model)
    inputs: np.ndarray  # (num_tokens, d_model): the token vectors, one per step

    @classmethod
    def draw(cls, num_tokens: int, d_model: int = 256, num_layers: int = 4, seed: int = 0) -> "ArticleSetup":
        for name, value in (("num_tokens", num_tokens), ("d_model", d_model), ("num_layers", num_layers)):
            if not isinstance(value, int) or value < 1:
                raise KVLibError(f"{name} must be a positive integer, not {value!r}")
        rng = np.random.default_rng(seed)
        weights = [tuple(rng.standard_normal((d_model, d_model)) for _ in range(3)) for _ in range(num_layers)]
        return cls(weights, rng.standard_normal((num_tokens, d_model)))


def loop_without_cache(setup: ArticleSetup) -> np.ndarray:
    """At step t every layer projects all t tokens to keys and values again; returns the last output."""
    for t in range(1, len(setup.inputs) + 1):
        seen = setup.inputs[:t]  # (t, d_model): every token so far
        for w_q, w_k, w_v in setup.weights:
            keys, values = seen @ w_k, seen @ w_v  # (t, d_model) each: recomputed from scratch
            query = seen[-1:] @ w_q  # (1, d_model): only the newest token asks
            out = (query @ keys.T) @ values  # (1, d_model)
    return out


def loop_with_cache(setup: ArticleSetup) -> np.ndarray:
    """Each layer projects only the new token and appends its key and value; returns the last output.

    The append is a concatenation, as in the article: it builds a new array and copies the
    whole cache into it at every step (the trap the chapter measures later).
    """
    d_model = setup.inputs.shape[1]
    keys = [np.empty((0, d_model)) for _ in setup.weights]
    values = [np.empty((0, d_model)) for _ in setup.weights]
    for t in range(len(setup.inputs)):
        new = setup.inputs[t : t + 1]  # (1, d_model)
        for layer, (w_q, w_k, w_v) in enumerate(setup.weights):
            keys[layer] = np.concatenate([keys[layer], new @ w_k])  # (t + 1, d_model)
            values[layer] = np.concatenate([values[layer], new @ w_v])
            out = ((new @ w_q) @ keys[layer].T) @ values[layer]
    return out


@dataclass(frozen=True)
class ArticleRun:
    """One length of the reproduction: timings of both loops and whether they agree."""

    num_tokens: int
    without_cache: Timing
    with_cache: Timing
    same_output: bool

    @property
    def speedup(self) -> float:
        """Fastest run without the cache over fastest run with it."""
        return self.without_cache.min_s / self.with_cache.min_s


def reproduce(lengths=(100, 200, 400), repeats_without: int = 1, repeats_with: int = 5, seed: int = 0,
              blas_threads: int | None = 1) -> list[ArticleRun]:
    """Time both loops at each length and check that they compute the same output.

    The loop without a cache takes seconds and runs ``repeats_without`` times; the cached
    loop takes milliseconds, where a moment of load from another program weighs more, so
    it runs ``repeats_with`` times. Speedups use the fastest run of each (the least
    disturbed). NumPy's BLAS runs on ``blas_threads`` threads (None: its default): with
    two on a small shared machine, each matrix product may wait for a second thread that
    another program holds.
    """
    runs = []
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        loop_with_cache(ArticleSetup.draw(8, seed=seed))  # warm-up
        for n in lengths:
            setup, out = ArticleSetup.draw(n, seed=seed), {}
            slow = time_it(lambda: out.update(slow=loop_without_cache(setup)), repeats=repeats_without, warmup=0)
            fast = time_it(lambda: out.update(fast=loop_with_cache(setup)), repeats=repeats_with, warmup=0)
            same = bool(np.allclose(out["slow"], out["fast"], rtol=1e-9, atol=0))
            runs.append(ArticleRun(n, slow, fast, same))
    return runs
