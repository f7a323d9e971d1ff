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

Both loops are timed the same way (:func:`reproduce`): the same number of rounds, the two
loops taking turns within each round, and the fastest run of each compared, so that a
burst of load from another program cannot favour one of them. :func:`step_profile` times
every step of the cached loop; :func:`cached_working_set` and :func:`cached_step_traffic`
count the bytes one such step touches and moves, which the chapter compares with the
last-level cache to explain how the cached loop's time grows, and :func:`loop_flops`
counts each loop's arithmetic.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from kvlib import KVLibError
from kvlib.checks import is_int
from kvlib.measure.timing import Timing, time_interleaved, time_it
from kvlib.units import ceil_div

# The article's table (NumPy on a CPU, d_model 256, 4 layers): tokens -> (no cache s, cache s, speedup).
ARTICLE_FIGURES = {100: (0.208, 0.061, 3.4), 200: (0.558, 0.125, 4.5), 400: (2.076, 0.346, 6.0)}


@dataclass(frozen=True)
class ArticleSetup:
    """Random weights and inputs of the article's experiment (float64, NumPy's default)."""

    weights: list  # per layer: (W_q, W_k, W_v), each (d_model, d_model)
    inputs: np.ndarray  # (num_tokens, d_model): the token vectors, one per step

    @classmethod
    def draw(cls, num_tokens: int, d_model: int = 256, num_layers: int = 4, seed: int = 0) -> ArticleSetup:
        """Draw the weights, then the inputs, from one NumPy generator seeded with ``seed``."""
        for name, value in (("num_tokens", num_tokens), ("d_model", d_model), ("num_layers", num_layers)):
            if not isinstance(value, int) or value < 1:
                raise KVLibError(f"{name} must be a positive integer, not {value!r}")
        rng = np.random.default_rng(seed)
        weights = [
            tuple(rng.standard_normal((d_model, d_model)) for _ in range(3)) for _ in range(num_layers)
        ]
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
    return deque(cached_steps(setup), maxlen=1)[0]  # run every step, keep the last output


def cached_steps(setup: ArticleSetup):
    """The cached loop one step at a time: yields the newest token's output after each step."""
    d_model = setup.inputs.shape[1]
    keys = [np.empty((0, d_model)) for _ in setup.weights]
    values = [np.empty((0, d_model)) for _ in setup.weights]
    for t in range(len(setup.inputs)):
        new = setup.inputs[t : t + 1]  # (1, d_model)
        for layer, (w_q, w_k, w_v) in enumerate(setup.weights):
            keys[layer] = np.concatenate([keys[layer], new @ w_k])  # (t + 1, d_model): a fresh copy
            values[layer] = np.concatenate([values[layer], new @ w_v])
            out = ((new @ w_q) @ keys[layer].T) @ values[layer]  # (1, d_model)
        yield out


def _check_sizes(**sizes) -> None:
    for name, value in sizes.items():
        if not is_int(value) or value < 1:
            raise KVLibError(f"{name} must be a positive integer, not {value!r}")


def cached_working_set(num_tokens: int, d_model: int = 256, num_layers: int = 4, itemsize: int = 8) -> int:
    """Distinct bytes the cached loop's step touches when the cache reaches ``num_tokens`` tokens.

    Every layer reads its three weight matrices, reads the old keys and values
    (num_tokens - 1 rows each) to copy them, and writes the new ones (num_tokens rows
    each). While this working set fits in a cache level, the step's bytes come from there;
    once it outgrows the last-level cache they come from DRAM.
    """
    _check_sizes(num_tokens=num_tokens, d_model=d_model, num_layers=num_layers, itemsize=itemsize)
    weights = 3 * d_model * d_model
    cache = 2 * d_model * ((num_tokens - 1) + num_tokens)  # K and V: the old rows read, the new rows written
    return num_layers * (weights + cache) * itemsize


def cached_step_traffic(num_tokens: int, d_model: int = 256, num_layers: int = 4, itemsize: int = 8) -> int:
    """Bytes the cached loop's step moves when the cache reaches ``num_tokens`` tokens: its
    working set, plus the attention's second read of the new keys and values."""
    _check_sizes(num_tokens=num_tokens, d_model=d_model, num_layers=num_layers, itemsize=itemsize)
    return (
        cached_working_set(num_tokens, d_model, num_layers, itemsize)
        + num_layers * 2 * num_tokens * d_model * itemsize
    )


def loop_flops(num_tokens: int, cached: bool, d_model: int = 256, num_layers: int = 4) -> int:
    """FLOPs of a whole loop to ``num_tokens`` tokens (a multiply-add is 2), exact.

    Step t, in every layer: without a cache, keys and values of all t tokens (2 x 2 t d^2)
    and the query (2 d^2); with one, the newest token's key, value and query (3 x 2 d^2);
    either way the scores and the weighted sum over t keys (2 x 2 t d).
    """
    _check_sizes(num_tokens=num_tokens, d_model=d_model, num_layers=num_layers)
    steps, tokens_summed = num_tokens, num_tokens * (num_tokens + 1) // 2
    d2 = d_model * d_model
    projections = 6 * d2 * steps if cached else 4 * d2 * tokens_summed + 2 * d2 * steps
    return num_layers * (projections + 4 * d_model * tokens_summed)


def cached_loop_traffic(num_tokens: int, d_model: int = 256, num_layers: int = 4, itemsize: int = 8) -> int:
    """Bytes the whole cached loop moves: :func:`cached_step_traffic` summed over its steps."""
    _check_sizes(num_tokens=num_tokens)
    return sum(cached_step_traffic(t, d_model, num_layers, itemsize) for t in range(1, num_tokens + 1))


@dataclass(frozen=True)
class ArticleRun:
    """One length of the reproduction: timings of both loops and whether they agree."""

    num_tokens: int
    without_cache: Timing
    with_cache: Timing
    same_output: bool

    @property
    def speedup(self) -> float:
        """Fastest run without the cache over fastest run with it (the least disturbed of each)."""
        return self.without_cache.min_s / self.with_cache.min_s


def _blas_threads(limit: int | None):
    """threadpoolctl's limit on numpy's BLAS threads, imported here: importing threadpoolctl sets
    ``KMP_DUPLICATE_LIB_OK`` in the environment, which importing kvlib must not do."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=limit, user_api="blas")


def _clock(blas_threads: int | None) -> str:
    """On one BLAS thread NumPy works on the calling thread alone: time it by that thread's CPU
    time, which another program's turns on the core do not stretch (:func:`kvlib.measure.timing.time_it`)."""
    return "thread" if blas_threads == 1 else "wall"


def reproduce(
    lengths=(100, 200, 400), repeats: int = 3, seed: int = 0, blas_threads: int | None = 1
) -> list[ArticleRun]:
    """Time both loops at each length by one protocol and check that they compute the same output.

    Each length runs ``repeats`` rounds; in each round both loops run once, taking turns
    to go first (:func:`~kvlib.measure.timing.time_interleaved`, built on
    :func:`~kvlib.measure.timing.time_it`). Speedups divide the fastest run of each: other
    programs can only add time to a run, so the fastest is the least disturbed, and a
    burst of load during one round falls on both loops. NumPy's BLAS runs on
    ``blas_threads`` threads (None: its default): on one thread a matrix product never
    waits for a second thread that another program holds, and no BLAS switches its
    kernel to a multi-threaded one as the matrices grow.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise KVLibError(f"repeats must be a positive integer, not {repeats!r}")
    runs = []
    with _blas_threads(blas_threads):
        loop_with_cache(ArticleSetup.draw(8, seed=seed))  # warm-up
        for n in lengths:
            setup, out = ArticleSetup.draw(n, seed=seed), {}
            timings = time_interleaved(
                {
                    "without": lambda out=out, setup=setup: out.update(slow=loop_without_cache(setup)),
                    "with": lambda out=out, setup=setup: out.update(fast=loop_with_cache(setup)),
                },
                rounds=repeats,
                number=1,
                warmup=0,
                device="cpu",
                clock=_clock(blas_threads),
            )
            same = bool(np.allclose(out["slow"], out["fast"], rtol=1e-9, atol=0))
            runs.append(ArticleRun(n, timings["without"], timings["with"], same))
    return runs


def step_profile(
    num_tokens: int, repeats: int = 3, seed: int = 0, blas_threads: int | None = 1
) -> np.ndarray:
    """Seconds of each step of the cached loop, (num_tokens,): the fastest of ``repeats`` runs, step by step.

    Step t (from 1) appends the t-th token, so its cost follows :func:`cached_step_traffic`
    of t; a burst of load hits a few steps of one run, and the other runs replace them.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise KVLibError(f"repeats must be a positive integer, not {repeats!r}")
    setup = ArticleSetup.draw(num_tokens, seed=seed)
    best = np.full(num_tokens, np.inf)
    with _blas_threads(blas_threads):
        loop_with_cache(ArticleSetup.draw(8, seed=seed))  # warm-up
        for _ in range(repeats):
            steps = cached_steps(setup)
            seconds = [
                time_it(
                    lambda steps=steps: next(steps), repeats=1, warmup=0, clock=_clock(blas_threads)
                ).min_s
                for _ in range(num_tokens)
            ]
            best = np.minimum(best, seconds)
    return best


def llc_crossing(llc: int, d_model: int = 256, num_layers: int = 4) -> int:
    """The first cache length at which the cached loop's step touches more bytes than ``llc``."""
    if not isinstance(llc, int) or llc < 1:
        raise KVLibError(f"llc must be a positive number of bytes, not {llc!r}")
    fixed = cached_working_set(1, d_model, num_layers)
    per_token = cached_working_set(2, d_model, num_layers) - fixed
    return 1 + max(0, ceil_div(llc + 1 - fixed, per_token))
