"""Chapter 1's measurement: greedy decoding with and without a KV cache, step by step.

:func:`race` runs several :class:`~kvlib.cache.generation.Decoder` modes side by side on the
same prompt. At every step each mode generates its next token and the step is timed with
:func:`~kvlib.measure.timing.time_it`, by :func:`~kvlib.measure.timing.clock_for` (on one CPU
thread the thread's CPU time, which another program's turns on the core do not stretch); the
modes take turns going first, so a stretch of load falls on both. One run to N tokens gives
the totals for every shorter length too (the first n steps of a greedy run do not depend on
N), the per-token latency at every position, and a check that every mode chose the same
tokens from logits that agree to rounding error. :func:`time_passes` and
:func:`estimated_total_s` extend the no-cache totals past the raced length.

Sizes depend on the device (:func:`nocache_setup`; on a GPU the batch comes from the measured
launch overhead and matmul rate, :func:`gpu_batch`); the chapter explains the choice. The
setup also gives the lengths of the concatenation trap, which :mod:`kvlib.chapters.ch01_no_cache.concat_trap`
measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from kvlib import KVLibError
from kvlib.cache.generation import MODES, Decoder
from kvlib.chapters.ch01_no_cache.concat_trap import trap_lengths
from kvlib.chapters.ch01_no_cache.costmodel import forward_flops
from kvlib.measure.probes import launch_overhead_s, matmul_gflops
from kvlib.measure.timing import clock_for, pick_device, time_it, torch_threads
from kvlib.model.config import ModelConfig
from kvlib.model.lean import LeanLlama
from kvlib.model.llama import TinyLlama


@dataclass(frozen=True)
class NoCacheSetup:
    """Model and lengths of chapter 1's measurement on one device, with the claim it supports."""

    device: torch.device
    config: ModelConfig
    batch: int
    race_length: int  # every step of both ways is timed up to this many generated tokens
    pass_lengths: tuple[int, ...]  # beyond it, no-cache passes are timed at these lengths only
    lengths: tuple[int, ...]  # generated tokens at which totals are reported
    claim_length: int  # the speedup at this many tokens must be at least ...
    claim_speedup: float  # ... this: a sanity floor (the chapter argues it), far below the article's 6.0x
    hf_length: int  # tokens generated in the comparison with transformers
    threads: int | None  # torch threads while timing (None: leave torch's setting)
    tokens_must_match: bool  # whether the timed runs must choose identical tokens (see nocache_setup)

    @property
    def longest(self) -> int:
        """The longest generation whose total is reported."""
        return max(self.lengths)

    @property
    def trap_lengths(self) -> tuple[int, ...]:
        """Cache lengths at which the concatenation trap is timed, the last read from DRAM
        (:func:`trap_lengths`; it reads the device's last-level cache, so it is computed when asked)."""
        return trap_lengths(self.config, self.batch, self.device)

    def prompt(self) -> torch.Tensor:
        """One start token per sequence (token ids 0, 1, ...), like the article's runs from nothing."""
        return torch.arange(self.batch, device=self.device)[:, None]  # (batch, 1)

    def model(self) -> LeanLlama:
        """The seeded model on this setup's device (weights drawn on the CPU: every device gets the same),
        lean: the benchmark's decode steps allocate nothing (:class:`~kvlib.model.lean.LeanLlama`, which
        chooses the fast cache; ``TinyLlama(config)`` is the same model, readable)."""
        return LeanLlama(self.config).eval().to(self.device)


# CPU: one sequence; 2 layers of width 384 (6 query heads sharing 2 K/V heads): 400 tokens
# without a cache take seconds on one core, and a cached step is mostly reading 12.8 MiB of
# float32 weights (kvlib.chapters.ch01_no_cache.step_roofline.step_work counts them) plus the fixed cost of
# the
# lean pass's ~70 small operations (kvlib.model.lean).
CPU_CONFIG = ModelConfig(d_model=384, num_layers=2, num_heads=6, num_kv_heads=2, d_ff=1024)

# GPU: a cached step of a tiny model costs the launch time of its few dozen kernels whatever the
# width, so the model is wider and decodes several sequences at once (:func:`gpu_batch`): a
# pass without a cache is then bound by arithmetic (as it is for real models) and the cached
# step still by launches.
GPU_CONFIG = ModelConfig(d_model=2048, num_layers=2, num_heads=16, num_kv_heads=4, d_ff=5504)

# A pass without a cache at the shortest reported length must do this many kernel launches'
# worth of arithmetic: ten times the ~200 launches of one pass.
GPU_PASS_LAUNCHES = 2000

GPU_MAX_BATCH = 256  # sequences: the largest batch gpu_batch picks


def gpu_batch(config: ModelConfig, tokens: int, launch_s: float, flops_per_s: float) -> int:
    """The smallest power-of-two batch (at most 256) at which one pass without a cache over
    ``tokens`` tokens does ``GPU_PASS_LAUNCHES`` launches' worth of arithmetic at ``flops_per_s``:
    chosen from the device's measured launch overhead and matmul rate, not fixed."""
    if launch_s <= 0 or flops_per_s <= 0:
        raise KVLibError("launch_s and flops_per_s must be positive")
    per_sequence = sum(forward_flops(config, tokens, tokens).values())
    batch = 1
    while batch < GPU_MAX_BATCH and batch * per_sequence < GPU_PASS_LAUNCHES * launch_s * flops_per_s:
        batch *= 2
    return batch


def nocache_setup(device: torch.device | str | None = None) -> NoCacheSetup:
    """Per-device sizes. The CPU makes its claims at 400 tokens, the GPU at 800.

    On the CPU the timed runs must choose identical tokens: the chapter's model keeps its
    best two logits at least 1e-3 apart along the run, a thousand times the rounding
    differences between the ways (tested). A GPU batch of random sequences (:func:`gpu_batch`)
    is likely to hit a near-tie somewhere, where rounding may pick the other token; the timing
    does not depend on which, and the chapter checks identical tokens on one sequence instead.
    The concatenation trap's lengths come from the device's last-level cache
    (:func:`~kvlib.chapters.ch01_no_cache.concat_trap.trap_lengths`).
    """
    device = pick_device() if device is None else torch.device(device)
    if device.type == "cuda":
        batch = gpu_batch(GPU_CONFIG, 100, launch_overhead_s(device), matmul_gflops(device).best_gflops * 1e9)
        return NoCacheSetup(
            device,
            GPU_CONFIG,
            batch=batch,
            race_length=800,
            pass_lengths=(),
            lengths=(100, 200, 400, 800),
            claim_length=800,
            claim_speedup=3.0,
            hf_length=100,
            threads=None,
            tokens_must_match=False,
        )
    return NoCacheSetup(
        device,
        CPU_CONFIG,
        batch=1,
        race_length=400,
        pass_lengths=(500, 600, 700, 800),
        lengths=(100, 200, 400, 800),
        claim_length=400,
        claim_speedup=3.0,
        hf_length=100,
        threads=1,
        tokens_must_match=True,
    )


@dataclass
class Race:
    """Outcome of :func:`race`: per-step seconds, tokens and agreement of each mode."""

    modes: tuple[str, ...]
    step_s: dict[str, np.ndarray]  # mode -> (num_new,) seconds of each step
    tokens: dict[str, torch.Tensor]  # mode -> (batch, prompt_len + num_new)
    max_logit_diff: dict[str, float]  # mode -> largest |logits - first mode's logits| over all steps
    min_gap: float  # smallest (best - second best) logit of the first mode over all steps
    # mode -> bytes its cache holds after each step
    cache_bytes: dict[str, np.ndarray] = field(default_factory=dict)
    # mode -> bytes its cache has copied so far
    bytes_copied: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_new(self) -> int:
        """Tokens every mode generated."""
        return len(self.step_s[self.modes[0]])

    def total_s(self, mode: str, n: int) -> float:
        """Seconds that ``mode`` took to generate the first ``n`` tokens."""
        if not 1 <= n <= self.num_new:
            raise KVLibError(f"n must be between 1 and {self.num_new} (the tokens raced), not {n}")
        return float(self.step_s[mode][:n].sum())

    def speedup(self, n: int, slow: str = "none", fast: str = "cache") -> float:
        """How many times faster ``fast`` generated the first ``n`` tokens than ``slow``."""
        return self.total_s(slow, n) / self.total_s(fast, n)

    @property
    def tokens_identical(self) -> bool:
        """Whether every mode chose the same tokens as the first."""
        first = self.tokens[self.modes[0]]
        return all(torch.equal(first, self.tokens[m]) for m in self.modes[1:])

    def steady(self, window: int = 9) -> Race:
        """The same race with every step's time replaced by :func:`fastest_nearby` (load removed)."""
        return replace(self, step_s={mode: fastest_nearby(s, window) for mode, s in self.step_s.items()})


def fastest_nearby(seconds: np.ndarray, window: int = 9) -> np.ndarray:
    """Each step's seconds replaced by the fastest of the ``window`` steps centred on it.

    A step is timed once (it changes the decoder's state), so a burst of load cannot be
    averaged away by repeating it. But neighbouring steps do almost the same work (a step
    at position t and one at t + 4 differ by 4 tokens in t), and another program can only
    add time: the fastest of a few neighbours is the undisturbed cost, as the fastest of
    several repeats is elsewhere in the book. Lockstep timing alone does not make load
    fair: a time slice lost to another program doubles a 2 ms cached step but adds a few
    percent to a 50 ms step without a cache.
    """
    seconds = np.asarray(seconds, dtype=np.float64)
    if not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise KVLibError(f"window must be a positive odd integer, not {window!r}")
    half = window // 2
    padded = np.pad(seconds, half, mode="edge")
    return np.lib.stride_tricks.sliding_window_view(padded, window).min(axis=1)


def race(
    model: TinyLlama, prompt: torch.Tensor, num_new: int, modes=("none", "cache"), warmup: int = 4
) -> Race:
    """Generate ``num_new`` tokens in every mode, in lockstep, timing each step of each mode.

    ``warmup`` untimed steps of every mode run first (on a copy of the race), so that the
    first timed step does not pay for memory allocation and library start-up. Steps are timed
    by :func:`~kvlib.measure.timing.clock_for` the prompt's device and torch's thread count: on
    one CPU thread (numba's kernels follow torch's count) the thread's CPU time.
    """
    modes = tuple(modes)
    if not modes or len(set(modes)) != len(modes) or not set(modes) <= set(MODES):
        raise KVLibError(f"modes must be distinct names among {', '.join(MODES)}, not {modes!r}")
    if warmup:
        for decoder in [Decoder(model, prompt, warmup, mode) for mode in modes]:
            for _ in range(warmup):
                decoder.step()
    decoders = [Decoder(model, prompt, num_new, mode) for mode in modes]
    clock = clock_for(prompt.device, torch.get_num_threads())
    step_s = {mode: np.zeros(num_new) for mode in modes}
    cache_bytes = {m: np.zeros(num_new, dtype=np.int64) for m in modes if m != "none"}
    bytes_copied = {m: np.zeros(num_new, dtype=np.int64) for m in modes if m == "concat"}
    max_diff = {mode: torch.zeros((), device=prompt.device) for mode in modes}
    min_gap = torch.full((), float("inf"), device=prompt.device)
    for step in range(num_new):
        order = range(len(modes)) if step % 2 == 0 else reversed(range(len(modes)))
        logits = [None] * len(modes)
        for i in order:
            out = {}
            timing = time_it(
                lambda d=decoders[i], out=out: out.update(logits=d.step()),
                repeats=1,
                warmup=0,
                device=prompt.device,
                clock=clock,
            )
            step_s[modes[i]][step] = timing.median_s
            logits[i] = out["logits"]
        top2 = logits[0].topk(2, dim=-1).values  # (batch, 2)
        min_gap = torch.minimum(min_gap, (top2[:, 0] - top2[:, 1]).min())
        for i, mode in enumerate(modes):
            max_diff[mode] = torch.maximum(max_diff[mode], (logits[i] - logits[0]).abs().max())
            if mode in cache_bytes:
                cache_bytes[mode][step] = decoders[i].cache.num_bytes
            if mode in bytes_copied:
                bytes_copied[mode][step] = decoders[i].cache.bytes_copied
    return Race(
        modes=modes,
        step_s=step_s,
        tokens={mode: d.tokens for mode, d in zip(modes, decoders, strict=True)},
        max_logit_diff={mode: value.item() for mode, value in max_diff.items()},
        min_gap=min_gap.item(),
        cache_bytes=cache_bytes,
        bytes_copied=bytes_copied,
    )


@torch.inference_mode()
def time_passes(model: TinyLlama, tokens: torch.Tensor, lengths, device=None, repeats: int = 3) -> np.ndarray:
    """Seconds of one no-cache pass over the first t tokens, for each t in ``lengths``: the fastest
    of ``repeats`` passes, by the clock :func:`race` uses.

    Such a pass is exactly what step t of generation without a cache runs, and it depends
    only on the tokens so far, so it can be timed at a few lengths of a long sequence
    instead of at every step (chapter 1 does this past 400 tokens). Unlike a step of the race it
    changes nothing, so it can be repeated, and the fastest pass is the least disturbed.
    """
    if any(not 1 <= t <= tokens.shape[1] for t in lengths):
        raise KVLibError(f"pass lengths must lie between 1 and {tokens.shape[1]} (the tokens given)")
    if not isinstance(repeats, int) or repeats < 1:
        raise KVLibError(f"repeats must be a positive integer, not {repeats!r}")
    device = tokens.device if device is None else torch.device(device)
    clock = clock_for(device, torch.get_num_threads())
    model(tokens[:, :1], last_only=True)  # warm-up
    return np.array(
        [
            time_it(
                lambda t=t: model(tokens[:, :t], last_only=True),
                repeats=repeats,
                warmup=0,
                device=device,
                clock=clock,
            ).min_s
            for t in lengths
        ]
    )


def estimated_total_s(step_s: np.ndarray, pass_lengths, pass_s: np.ndarray, n: int) -> float:
    """Seconds of n no-cache steps: the measured steps, then passes interpolated between timed lengths.

    ``step_s`` are measured no-cache steps 1..len(step_s); steps beyond are read off a
    straight line between the nearest timed passes (``pass_lengths`` ascending, the last
    at least n), starting from the median of the last measured steps.
    """
    measured = len(step_s)
    if n <= measured:
        return float(np.sum(step_s[:n]))
    if max(pass_lengths) < n or list(pass_lengths) != sorted(pass_lengths):
        raise KVLibError(f"pass lengths must be ascending and reach {n}")
    lengths = np.concatenate([[measured], np.asarray(pass_lengths, dtype=np.float64)])
    seconds = np.concatenate([[np.median(step_s[-9:])], pass_s])
    beyond = np.interp(np.arange(measured + 1, n + 1), lengths, seconds)
    return float(np.sum(step_s) + beyond.sum())


def bench(lengths=(400, 800)) -> dict:
    """``python -m kvlib bench`` fields of chapter 1.

    Speedups of the preallocated cache over no cache (one full race on the real model, steady
    step times as in the chapter), our cached tokens/s over transformers' cached ``generate``
    on the same weights (fastest of three interleaved runs each, as in the chapter), and
    whether every run chose the same tokens.
    """
    from kvlib.chapters.ch01_no_cache.transformers_race import race_generators

    setup = nocache_setup()
    with torch_threads(setup.threads):
        model, prompt = setup.model(), setup.prompt()
        result = race(model, prompt, max(lengths)).steady()  # as the chapter: each step's undisturbed time
        hf_len = min(setup.hf_length, max(lengths))
        versus = race_generators(
            model, prompt, hf_len, repeats=3, names=("kvlib cache", "transformers cache")
        )
    identical = result.tokens_identical and all(
        torch.equal(tokens, result.tokens["cache"][:, : 1 + hf_len]) for tokens in versus.tokens.values()
    )
    fields = {f"cache_speedup_{n}": round(result.speedup(n), 2) for n in lengths}
    fields["hf_tokens_per_s_ratio"] = round(
        versus.tokens_per_s("kvlib cache") / versus.tokens_per_s("transformers cache"), 2
    )
    fields["tokens_identical"] = bool(identical)
    return fields
