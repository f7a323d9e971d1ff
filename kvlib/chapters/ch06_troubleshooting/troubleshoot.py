"""Running out of KV-cache memory, and decoding that slows with the context (the troubleshooting page).

The experiments of ``book/06_troubleshooting.ipynb``, the page after chapter 5. It reuses
the earlier chapters' pieces (chapter 1's model, chapter 2's decode setup, chapter 3's paged
cache) to reproduce two problems a reader may meet and to say what to expect of them.

A server that adds sequences to a batch adds caches, and the caches grow linearly with the
batch and the context until the memory set aside for them is gone. This module shows both
ends of that story:

- :func:`batch_sweep` runs the model of chapter 1 on a paged cache (chapter 3) whose pool is
  sized from a byte budget, for growing batches. When the prompts need more blocks than the
  pool has, the block manager refuses the allocation and the run stops with a one-line
  :class:`~kvlib.KVLibError`: running out is a normal condition to report, not a crash.
- :func:`requests_that_fit` answers the planning question for a real model: how many
  requests of given lengths can hold their caches at once in the free memory of a GPU,
  when each reserves its maximum length (contiguous) or only the blocks it fills (paged).

Section 2 of the page (decoding slows down as the context grows) measures with
:func:`measure_growth` and checks the growth against :func:`growth_bounds`, the arithmetic
of a step that costs a fixed amount plus the same work per cached token, at most a cache's
worth of which can come from the last-level cache. The bandwidth probe it compares the
steps with is timed in the same rounds as the steps, so that every comparison is between
samples taken back to back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.cache.contiguous import kv_bytes_per_token
from kvlib.chapters.ch02_cache_size.decode_roofline import DecodeMeasurement
from kvlib.chapters.ch02_cache_size.decode_speed import DecodeSetup
from kvlib.measure.hardware import available_memory_bytes, llc_bytes
from kvlib.measure.probes import Bandwidth
from kvlib.measure.timing import round_median, time_interleaved, torch_threads
from kvlib.model.attention import grouped_attention
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import generate_paged
from kvlib.units import ceil_div


@dataclass(frozen=True)
class BatchOutcome:
    """One run of :func:`batch_sweep`: did ``batch`` requests fit in the pool, and if not, why."""

    batch: int
    num_blocks: int  # blocks the byte budget buys
    pool_bytes: int | None  # bytes of the K/V pool of a finished run (None if the run was refused)
    error: str | None  # the refusal, or None when every request finished

    @property
    def ran(self) -> bool:
        """Whether every request of the batch finished."""
        return self.error is None

    def row(self) -> dict:
        """The outcome as one row of the page's table."""
        outcome = f"ran in a pool of {self.pool_bytes:,} bytes" if self.ran else f"refused: {self.error}"
        return {"batch": self.batch, "blocks in budget": self.num_blocks, "outcome": outcome}


def block_bytes(model: TinyLlama, block_size: int) -> int:
    """Bytes of one block of the paged cache: ``block_size`` tokens' K and V in every layer."""
    return block_size * kv_bytes_per_token(model.config, model.lm_head.weight.dtype)


def batch_sweep(
    model: TinyLlama,
    prompts: Sequence[Sequence[int]],
    num_new: int,
    budget_bytes: int,
    batches: Sequence[int],
    block_size: int = 16,
) -> list[BatchOutcome]:
    """Generate ``num_new`` tokens for the first ``batch`` prompts, for each batch, in a pool of
    ``budget_bytes // block_bytes`` blocks; a refusal by the block manager is recorded, not raised."""
    num_blocks = budget_bytes // block_bytes(model, block_size)
    if num_blocks < 1:
        raise KVLibError(
            f"a budget of {budget_bytes:,} bytes holds no block of {block_bytes(model, block_size):,} bytes"
        )
    if not batches or min(batches) < 1 or max(batches) > len(prompts):
        raise KVLibError(
            f"batches must lie between 1 and the {len(prompts)} prompts given, not {list(batches)}"
        )
    outcomes = []
    for batch in batches:
        try:
            run = generate_paged(
                model, prompts[:batch], num_new, block_size=block_size, num_blocks=num_blocks
            )
            outcomes.append(BatchOutcome(batch, num_blocks, run.cache.num_bytes, None))
        except KVLibError as error:
            outcomes.append(BatchOutcome(batch, num_blocks, None, str(error)))
    return outcomes


def requests_that_fit(
    lengths: Sequence[int],
    free_bytes: int,
    bytes_per_token: int,
    block_size: int | None = 16,
    reserve: int | None = None,
) -> int:
    """How many of the requests, taken in order, hold their caches at once in ``free_bytes``.

    Each request of final length ``n`` takes ``reserve`` token slots if given (contiguous
    reservation of the maximum length), else ``n`` rounded up to whole blocks of
    ``block_size`` (paging; ``None`` means exactly ``n``).
    """
    if free_bytes < 0 or bytes_per_token < 1:
        raise KVLibError(
            f"need free_bytes >= 0 and bytes_per_token >= 1, not {free_bytes} and {bytes_per_token}"
        )
    if reserve is not None and max(lengths, default=0) > reserve:
        raise KVLibError(f"a request of {max(lengths)} tokens does not fit its reservation of {reserve}")
    used, fitted = 0, 0
    for n in lengths:
        if n < 1:
            raise KVLibError(f"request lengths must be positive, not {n}")
        slots = (
            reserve
            if reserve is not None
            else (n if block_size is None else ceil_div(n, block_size) * block_size)
        )
        used += slots * bytes_per_token
        if used > free_bytes:
            break
        fitted += 1
    return fitted


TINY_CONTEXT = 16  # tokens: a step this short costs its fixed per-call cost and hardly anything else


@dataclass(frozen=True)
class GrowthRun:
    """Decode steps of one layer's attention, timed together by :func:`measure_growth`.

    ``steps`` holds MHA at ``TINY_CONTEXT`` tokens and at every context of the setup, then
    GQA-8 and MQA at the longest; each timing's ``min_s`` is its fastest of the interleaved
    rounds. ``probe`` is the DRAM bandwidth probe (chapter 0's streaming sum) over the K and V
    buffers that MHA's longest step reads, on the setup's threads, timed in the same rounds:
    its timing's samples pair with the steps' round by round.
    """

    setup: DecodeSetup
    llc_bytes: int
    probe: Bandwidth
    steps: tuple[DecodeMeasurement, ...]

    def step(self, num_kv_heads: int, context: int) -> DecodeMeasurement:
        """The measured step with ``num_kv_heads`` KV heads at ``context`` tokens."""
        for m in self.steps:
            if (m.num_kv_heads, m.context) == (num_kv_heads, context):
                return m
        raise KVLibError(f"no step with {num_kv_heads} KV heads at {context:,} tokens was measured")

    def dram_share(self, m: DecodeMeasurement) -> float:
        """The least share of the step's K+V that must come from DRAM: 1 - LLC / K+V (0 if it fits)."""
        return max(0.0, 1 - self.llc_bytes / m.kv_bytes)

    def dram_rate_over_probe(self, m: DecodeMeasurement) -> float:
        """How fast the step read the bytes that must come from DRAM (its K+V less the LLC) against
        the probe's rate in the same round: the median over the rounds of that ratio."""
        dram_part = m.kv_bytes - self.llc_bytes
        if dram_part <= 0:
            raise KVLibError(
                f"the step's {m.kv_bytes / 2**20:,.0f} MiB of K+V fit in the "
                f"{self.llc_bytes / 2**20:,.0f} MiB LLC"
            )
        return round_median(
            lambda t_step, t_probe: (dram_part / t_step) / (self.probe.num_bytes / t_probe),
            m.timing,
            self.probe.timing,
        )

    def speedup(self, num_kv_heads: int) -> float:
        """MHA's step over the step with ``num_kv_heads`` at the longest context (median over rounds)."""
        mha, fewer = (
            self.step(self.setup.num_heads, self.setup.longest),
            self.step(num_kv_heads, self.setup.longest),
        )
        return round_median(lambda a, b: a / b, mha.timing, fewer.timing)

    def rows(self) -> list[dict]:
        """One row per measured step: its K+V against the LLC, its fastest time, its bandwidth, and
        that bandwidth against the probe's in the same round (median over the rounds)."""
        return [
            {
                "KV heads": m.num_kv_heads,
                "context": m.context,
                "K+V (MiB)": m.kv_bytes / 2**20,
                "x LLC": m.kv_bytes / self.llc_bytes,
                "fastest (ms)": m.timing.min_s * 1e3,
                "GB/s": m.best_gbps,
                "share of probe": round_median(
                    lambda t_step, t_probe, m=m: (m.kv_bytes / t_step) / (self.probe.num_bytes / t_probe),
                    m.timing,
                    self.probe.timing,
                ),
            }
            for m in self.steps
        ]


def measure_growth(setup: DecodeSetup, rounds: int = 7) -> GrowthRun:
    """Time MHA's decode step at ``TINY_CONTEXT``, at every context of ``setup`` and at half the
    longest, GQA-8 and MQA at the longest, and the DRAM bandwidth probe, in interleaved rounds
    (:func:`kvlib.measure.time_interleaved`) on the setup's threads.

    Half the longest context is there because
    :func:`kvlib.chapters.ch02_cache_size.decode_speed.decode_setup` makes the
    longest hold at least twice :func:`kvlib.measure.dram_bytes`: so MHA's K+V at half of it
    is at least four times the LLC on every machine, and the growth between the two is the
    growth of two steps read from DRAM. Interleaving needs every cache at once, so all of
    them are contiguous views of one seeded K and one V buffer, as large as MHA's at the
    longest context (a step reads each byte once whatever else shares its memory, and at
    most the LLC's worth of any data is in the cache when a step begins); a KVLibError says
    so when memory is short. The probe is chapter 0's streaming read, a sum, over those two
    buffers: as many bytes as MHA's longest step reads, at least twice
    :func:`kvlib.measure.dram_bytes` on a CPU, so nearly all from DRAM; timed in the same rounds,
    it sees the same load as the steps it is compared with.
    """
    contexts = sorted({*setup.contexts, setup.longest // 2})
    configs = [(setup.num_heads, TINY_CONTEXT)] + [(setup.num_heads, n) for n in contexts]
    configs += [(kv, setup.longest) for kv in (8, 1) if kv < setup.num_heads and setup.num_heads % kv == 0]
    numel = setup.batch * setup.num_heads * setup.longest * setup.head_dim
    needed = 2 * numel * torch.empty((), dtype=setup.dtype).element_size()
    available = available_memory_bytes(setup.device)
    if needed > available // 2:
        raise KVLibError(
            f"the decode caches need {needed / 2**30:.1f} GiB, "
            f"over half the {available / 2**30:.1f} GiB available"
        )
    generator = torch.Generator(setup.device).manual_seed(0)

    def uniform(*shape: int) -> torch.Tensor:
        """A seeded tensor of ``shape``, uniform in [-1, 1), drawn from the one generator."""
        return torch.empty(shape, device=setup.device, dtype=setup.dtype).uniform_(-1, 1, generator=generator)

    k_memory, v_memory = uniform(numel), uniform(numel)
    q = uniform(setup.batch, setup.num_heads, 1, setup.head_dim)

    def step(kv: int, n: int):
        shape = (setup.batch, kv, n, setup.head_dim)
        k, v = (memory[: math.prod(shape)].view(shape) for memory in (k_memory, v_memory))
        return lambda: grouped_attention(q, k, v, q_start=n - 1)

    def probe() -> None:  # a sum reads each element once and adds it: memory-bound on any device
        k_memory.sum(dtype=torch.float32)
        v_memory.sum(dtype=torch.float32)

    fns = {f"{kv}x{n}": step(kv, n) for kv, n in configs} | {"probe": probe}
    with torch.inference_mode(), torch_threads(setup.threads):
        timings = time_interleaved(fns, rounds=rounds, device=setup.device)
    itemsize = k_memory.element_size()
    bandwidth = Bandwidth(str(setup.device), 2 * numel * itemsize, timings["probe"], threads=setup.threads)
    steps = tuple(
        DecodeMeasurement(
            "grouped", kv, n, setup.batch, setup.num_heads, setup.head_dim, itemsize, timings[f"{kv}x{n}"]
        )
        for kv, n in configs
    )
    return GrowthRun(setup, llc_bytes(setup.device), bandwidth, steps)


def growth_bounds(short_bytes: int, long_bytes: int, llc: int) -> tuple[float, float | None]:
    """What arithmetic allows for the time of a decode step over ``long_bytes`` of K+V against one
    over ``short_bytes`` (the same step shape, ``r = long_bytes / short_bytes`` times the tokens).

    Model: a step costs a fixed ``c >= 0`` (launches, dispatch) plus the same work per cached
    token, and a token costs at most ``tau`` (what it costs from DRAM) and at least nothing
    (from the cache). A step reads each byte once, so at most ``llc`` bytes of it can be
    found in the cache. Then, with ``t_tiny >= c`` the time of a tiny step:

    - lower: ``(t_long - t_tiny) / (t_short - t_tiny) >= r * (1 - llc / long_bytes)``:
      the long step pays ``tau`` for all but ``llc`` of its bytes, the short one at most
      ``tau`` for each, and subtracting more than ``c`` only raises the ratio;
    - upper: ``t_long / t_short <= r / (1 - llc / short_bytes)``, when ``short_bytes > llc``
      (else None: a short step served from the cache may be arbitrarily faster).
    """
    if not 0 < short_bytes < long_bytes or llc < 1:
        raise KVLibError(
            f"need 0 < short_bytes < long_bytes and llc >= 1, not {short_bytes}, {long_bytes}, {llc}"
        )
    ratio = long_bytes / short_bytes
    lower = ratio * max(0.0, 1 - llc / long_bytes)
    upper = ratio / (1 - llc / short_bytes) if short_bytes > llc else None
    return lower, upper


def growth_checks(run: GrowthRun) -> list[dict]:
    """MHA's step at the longest context against each shorter one: measured ratios (medians
    over the rounds, :func:`kvlib.measure.round_median`; the tiny step's time stands
    for the fixed cost) beside :func:`growth_bounds`, and how many times the LLC the shorter
    step's K+V is (the upper bound exists only above 1x; at 4x and more the step is read from DRAM).
    """
    longest = run.step(run.setup.num_heads, run.setup.longest)
    tiny = run.step(run.setup.num_heads, TINY_CONTEXT).timing
    rows = []
    for short in sorted(
        (
            m
            for m in run.steps
            if m.num_kv_heads == run.setup.num_heads and TINY_CONTEXT < m.context < longest.context
        ),
        key=lambda m: m.context,
    ):
        lower, upper = growth_bounds(short.kv_bytes, longest.kv_bytes, run.llc_bytes)
        times = longest.timing, short.timing, tiny
        rows.append(
            {
                "from context": short.context,
                "to context": longest.context,
                "x LLC": short.kv_bytes / run.llc_bytes,
                "bytes ratio": longest.kv_bytes / short.kv_bytes,
                "time ratio": round_median(lambda t_long, t_short, t_tiny: t_long / t_short, *times),
                "upper bound": upper,
                "time ratio less fixed cost": round_median(
                    lambda t_long, t_short, t_tiny: (t_long - t_tiny) / (t_short - t_tiny), *times
                ),
                "lower bound": lower,
            }
        )
    return rows
