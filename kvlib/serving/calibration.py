"""Calibration of the simulator's step-time model from real steps of ``kvlib.model`` (chapter 4).

:func:`calibrate` times decode steps of batches of several sizes and lengths, and prefills
of several lengths, on a :class:`~kvlib.paged.paged_cache.PagedKVCache`, through the same
paged decode loop as the real engine (:func:`kvlib.paged.decode_loop.decode_step` and
:func:`kvlib.paged.decode_loop.prefill`), on the clock the engine uses
(:func:`kvlib.serving.engine.engine_clock`). It fits
:class:`kvlib.serving.step_time.StepTimeModel` to them, which :func:`kvlib.serving.simulator.simulate`
then uses in place of the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from kvlib.measure.timing import one_cpu_thread, time_it
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import num_blocks_for
from kvlib.paged.decode_loop import decode_step, prefill
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.engine import engine_clock
from kvlib.serving.step_time import StepTimeModel, fit_step_time

DECODE_POINTS = (
    (1, 16),
    (1, 1024),
    (4, 16),
    (4, 2048),
    (16, 16),
    (16, 960),
    (64, 16),
    (64, 240),
)  # (sequences, tokens each)

PREFILL_LENGTHS = (16, 128, 512, 1024)


@dataclass(frozen=True)
class Calibration:
    """Measured steps (rows) and the :class:`StepTimeModel` fitted to them."""

    rows: list[dict]
    model: StepTimeModel


def decode_lengths(num_seqs: int, length: int, block_size: int) -> list[int]:
    """Lengths of a calibration decode point: ``length`` tokens, less 0 to ``block_size - 1``
    from one sequence to the next, so that the kernel masks keys as in a real batch of
    different lengths, while padding stays under one block (vLLM's kernel reads none)."""
    return [length - i % min(length, block_size) for i in range(num_seqs)]


@torch.inference_mode()
def _decode_step_s(model: TinyLlama, num_seqs: int, length: int, block_size: int, repeats: int) -> float:
    """Fastest of ``repeats`` paged decode steps of ``num_seqs`` sequences of about ``length`` tokens."""
    device = model.lm_head.weight.device
    lengths = decode_lengths(num_seqs, length, block_size)
    num_blocks = num_seqs * num_blocks_for(length + repeats + 2, block_size)
    cache = PagedKVCache.for_model(model, num_blocks, block_size, enable_prefix_caching=False)
    tokens = [[1] * seq_len for seq_len in lengths]  # this loop owns every sequence's tokens
    for seq, seq_tokens in enumerate(tokens):
        cache.manager.allocate(seq, seq_tokens)
        cache.manager.mark_computed(seq)  # the K/V stay zero: timing does not depend on their values
    seqs = list(range(num_seqs))

    def step():
        for seq_tokens in tokens:
            seq_tokens.append(1)
        decode_step(model, cache, seqs, tokens)

    return time_it(step, repeats=repeats, warmup=1, device=device, clock=engine_clock(device)).min_s


@torch.inference_mode()
def _prefill_s(model: TinyLlama, length: int, block_size: int, repeats: int) -> float:
    """Fastest prefill of one prompt of ``length`` tokens."""
    device = model.lm_head.weight.device
    cache = PagedKVCache(
        model.config,
        num_blocks_for(length, block_size),
        block_size,
        device=device,
        dtype=model.lm_head.weight.dtype,
        enable_prefix_caching=False,
    )
    prompt = [1] * length

    def one_prefill():
        cache.manager.allocate(0, prompt)
        prefill(model, cache, 0, prompt, 0)
        cache.manager.free(0)

    return time_it(one_prefill, repeats=repeats, warmup=1, device=device, clock=engine_clock(device)).min_s


def calibrate(
    model: TinyLlama,
    decode_points=DECODE_POINTS,
    prefill_lengths=PREFILL_LENGTHS,
    block_size: int = 16,
    repeats: int = 5,
    rounds: int = 4,
    progress: bool = True,
) -> Calibration:
    """Time real decode steps and prefills of ``model`` on a paged cache and fit the step-time model.

    Every point is measured ``rounds`` times, the rounds one after another, each in its own
    (seeded) order of points, and keeps its fastest repeat: a program that steals the
    processor can only make a repeat slower, and is unlikely to hit the same point in
    every round. The sequences of a decode point
    differ in length by less than a block (:func:`decode_lengths`), so the kernel masks,
    but reads almost no padding. On the CPU the model runs on one thread, as in the real
    engine.
    """
    device = model.lm_head.weight.device
    work = [("decode", n, length) for n, length in decode_points] + [
        ("prefill", 1, length) for length in prefill_lengths
    ]
    best = [math.inf] * len(work)
    with (
        one_cpu_thread(device),
        tqdm(total=rounds * len(work), desc="calibration", disable=not progress) as bar,
    ):
        for round_ in range(rounds):
            for i in np.random.default_rng(round_).permutation(len(work)):  # a new order in every round
                kind, n, length = work[i]
                if kind == "decode":
                    seconds = _decode_step_s(model, n, length, block_size, repeats)
                else:
                    seconds = _prefill_s(model, length, block_size, repeats)
                best[i] = min(best[i], seconds)
                bar.update(1)
    rows = [
        dict(
            kind=kind,
            num_seqs=n,
            context_tokens=sum(decode_lengths(n, length, block_size)) if kind == "decode" else 0,
            prefill_tokens=length if kind == "prefill" else 0,
            seconds=seconds,
        )
        for (kind, n, length), seconds in zip(work, best, strict=True)
    ]
    columns = {
        key: np.array([row[key] for row in rows])
        for key in ("num_seqs", "context_tokens", "prefill_tokens", "seconds")
    }
    fitted = fit_step_time(
        columns["num_seqs"],
        columns["context_tokens"],
        columns["prefill_tokens"],
        columns["seconds"],
        source=f"kvlib.model on {device.type}",
    )
    for row in rows:
        row["fitted_s"] = float(fitted.predict(row["num_seqs"], row["context_tokens"], row["prefill_tokens"]))
    return Calibration(rows, fitted)
