"""The real serving engine: ``kvlib.model`` on a :class:`~kvlib.paged.paged_cache.PagedKVCache`,
scheduled by :class:`kvlib.serving.scheduler.Scheduler` (chapter 4).

Every policy stores K/V in the same paged cache; what differs is admission. ``paged``
takes blocks as tokens arrive and preempts (recomputes) when they run out; ``max``,
``pow2`` and ``oracle`` admit a request only when its contiguous reservation fits in the
budget, and the cache behind them gets spare blocks so that storage never limits them.
Each step runs one forward pass per prefilled prompt (``PagedKVCache`` feeds every
scheduled sequence the same number of tokens) and one for all decoding sequences, through
the paged decode loop's steps (:func:`kvlib.paged.decode_loop.prefill` and
:func:`kvlib.paged.decode_loop.greedy_step`). Each request's tokens live in its
``SeqState.tokens``, which the block manager only reads. :func:`race_engine` times the
policies fairly; :func:`solo_tokens` is the reference every request's output must equal.
The simulator's calibration from measured steps is in :mod:`kvlib.serving.calibration`.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from tqdm.auto import tqdm

from kvlib import KVLibError
from kvlib.cache.generation import generate
from kvlib.checks import require_int
from kvlib.measure.timing import clock_for, one_cpu_thread, read_clock, synchronize
from kvlib.model.llama import TinyLlama
from kvlib.paged.decode_loop import greedy_step, prefill
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.placement import make_memory
from kvlib.serving.results import RunResult, result_from
from kvlib.serving.scheduler import Scheduler, SchedulerConfig
from kvlib.serving.simulator import checked_requests
from kvlib.serving.speculative_engine import speculator, target_share
from kvlib.serving.swap import HostPool
from kvlib.serving.traces import Request
from kvlib.serving.types import StepPlan


def engine_clock(device: torch.device) -> str:
    """How the engine's steps are timed: on the CPU (one thread) the thread's CPU time, which a
    busy machine cannot stretch; on a GPU the wall clock (see :func:`kvlib.measure.time_it`)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise KVLibError(
            f"device must be a torch device such as 'cpu' or 'cuda', not {device!r}"[:200]
        ) from None
    return clock_for(device, 1 if device.type == "cpu" else None)


@torch.inference_mode()
def execute(model: TinyLlama, cache: PagedKVCache, plan: StepPlan, speculate=None) -> list:
    """Run one step's forward passes; returns the greedy next token of each planned sequence that gets
    one (``plan.seqs``: prefills first).

    Each prefill (or prefill chunk: chapter 8) is its own forward pass over ``tokens[start:end]``,
    the K/V before ``start`` already in the cache; only a chunk that ends its sequence yields a
    token. All decodes share one pass. The scheduler's memory has already given every decoding
    sequence's newest token its slot, so the decode step appends none. ``speculate(seqs)``, if
    given, decodes instead and returns a list of new tokens per sequence (speculative decoding).
    """
    tokens: list = []
    for seq, start, end in plan.chunks:
        logits = prefill(
            model, cache, seq.seq_id, seq.tokens, start, None if plan.prefill_ends is None else end
        )
        if end == len(seq.tokens):
            tokens.append(int(logits.argmax()))
    if plan.decodes and speculate is not None:
        tokens += speculate(list(plan.decodes))
    elif plan.decodes:
        seq_ids, token_ids = [s.seq_id for s in plan.decodes], [s.tokens for s in plan.decodes]
        tokens += greedy_step(model, cache, seq_ids, token_ids, append_slots=False)
    return tokens


def run_engine(
    model: TinyLlama,
    requests: list[Request],
    policy: str,
    num_slots: int,
    max_len: int,
    block_size: int = 16,
    config: SchedulerConfig | None = None,
    progress: bool = True,
    clock: str = "wall",
    draft: TinyLlama | None = None,
    num_speculative_tokens: int = 0,
) -> RunResult:
    """Serve ``requests`` with the model under one policy and a budget of ``num_slots`` token slots.

    Arrivals and finishing times follow the wall clock; requests whose arrival lies ahead
    are waited for; ``steps["duration_s"]`` holds each step's wall-clock seconds, and
    ``steps["clock_s"]`` the same steps read on ``clock`` (``"thread"``: the CPU time of
    this thread, which :func:`race_engine` uses). Each finished request's tokens are in
    ``result.finished[i].tokens`` (prompt, then its output).

    Chapter 8: ``config`` may turn on chunked prefill and swapping (the host pool, a CPU
    tensor of ``config.num_host_blocks`` blocks, pinned on a GPU); ``draft`` with
    ``num_speculative_tokens`` >= 1 decodes speculatively
    (:func:`kvlib.serving.speculative.speculative_decode`); the draft's cache then comes out of the
    same budget, ``num_slots`` slots of the target's bytes, and the target keeps
    :func:`~kvlib.serving.speculative_engine.target_share` of them (the result's ``num_slots``).
    """
    config = SchedulerConfig() if config is None else config
    if not isinstance(config, SchedulerConfig):
        raise KVLibError(f"config must be a SchedulerConfig or None, not {type(config).__name__}")
    if not isinstance(model, TinyLlama) or (draft is not None and not isinstance(draft, TinyLlama)):
        raise KVLibError(f"model and draft must be kvlib TinyLlama models, not {type(model).__name__}")
    num_slots, max_len = require_int(num_slots, "num_slots"), require_int(max_len, "max_len")
    block_size = require_int(block_size, "block_size")
    requests = checked_requests(requests)
    vocab_size = model.config.vocab_size
    largest = max(max(r.prompt) for r in requests)
    if largest >= vocab_size:  # the embedding would raise an IndexError at that request's prefill
        raise KVLibError(
            f"a request's prompt holds token id {largest}; the model's vocabulary is 0..{vocab_size - 1}"
        )
    device = model.lm_head.weight.device
    if max(r.total_len for r in requests) > min(max_len, model.config.max_seq_len):
        raise KVLibError(f"a request is longer than max_len {max_len} or the model's max_seq_len")
    if draft is not None:  # its cache comes out of the same budget: the target keeps its share
        num_slots = target_share(model, draft, num_slots, block_size)
    num_blocks = num_slots // block_size + (0 if policy == "paged" else config.max_num_seqs)
    cache = PagedKVCache.for_model(model, num_blocks, block_size, enable_prefix_caching=False)
    host = HostPool(config.num_host_blocks, block_size, cache) if config.preemption_mode == "swap" else None
    scheduler = Scheduler(
        make_memory(policy, num_slots, max_len, block_size, manager=cache.manager), requests, config, host
    )
    speculate = speculator(model, draft, num_speculative_tokens, cache, max_len, config)
    durations, clocked = [], []  # per step: wall seconds (start + duration = finish), seconds on ``clock``
    with (
        one_cpu_thread(device),
        tqdm(total=len(requests), desc=f"engine: {policy}", disable=not progress) as bar,
    ):
        start = time.perf_counter()
        while scheduler.has_work():
            now = time.perf_counter() - start
            idle = not (scheduler.running or scheduler.waiting or scheduler.swapped)
            if idle and scheduler.next_arrival() > now:
                time.sleep(scheduler.next_arrival() - now)
                now = time.perf_counter() - start
            step_start = read_clock(clock)
            plan = scheduler.schedule(now)
            if plan.num_seqs == 0:
                raise KVLibError(f"policy {policy}: nothing can run with {num_slots} slots")
            tokens = execute(model, cache, plan, speculate)
            synchronize(device)
            clocked.append(read_clock(clock) - step_start)
            end = time.perf_counter() - start
            durations.append(end - now)
            num_done = len(scheduler.finished)
            scheduler.complete(plan, tokens, end)
            if speculate is not None:
                speculate.forget(scheduler.running)
            bar.update(len(scheduler.finished) - num_done)
    result = result_from(scheduler, policy, durations)
    result.steps["clock_s"] = np.array(clocked)
    return result


def race_engine(
    model: TinyLlama,
    requests: list[Request],
    policies,
    num_slots: int,
    max_len: int,
    rounds: int = 3,
    progress: bool = True,
) -> dict[str, RunResult]:
    """Serve the same requests under each policy ``rounds`` times, the policies interleaved in
    every round, and time each step of a policy by its fastest of the rounds (chapter 4's real engine).

    Every request must be queued at the start: the runs of one policy then schedule exactly
    the same steps, and only the clock differs. A program that shares the machine can only
    make a step slower, and a step is slowed in all rounds only if the load lasts through
    all of them, so each step's fastest of a few runs is the fair measurement, as in
    :func:`calibrate`; a policy's time is the sum over its steps (scheduling and forward
    passes; the bookkeeping between steps is left out, for every policy alike). On the CPU
    each step is read on the thread's CPU time (:func:`engine_clock`), which another
    program's turns on the core do not stretch. Keeping each
    policy's fastest whole run instead let a spell of load that covered most of the race,
    but not all, favour whichever policy happened to run outside it.
    """
    if rounds < 1:
        raise KVLibError(f"rounds must be at least 1, got {rounds}")
    if any(r.arrival_s > 0 for r in requests):
        raise KVLibError(
            "race_engine needs every request queued at time 0, so that every run schedules the same steps"
        )
    runs: dict[str, list[RunResult]] = {policy: [] for policy in policies}
    with tqdm(total=rounds * len(policies), desc="engine runs", disable=not progress) as bar:
        for _ in range(rounds):
            for policy in policies:
                runs[policy].append(
                    run_engine(
                        model,
                        requests,
                        policy,
                        num_slots,
                        max_len,
                        progress=False,
                        clock=engine_clock(model.lm_head.weight.device),
                    )
                )
                bar.update()
    fastest = {}
    for policy, results in runs.items():
        durations = [r.steps["clock_s"] for r in results]
        if len({len(d) for d in durations}) != 1:
            raise KVLibError(f"policy {policy}: the runs scheduled different steps")
        fastest[policy] = results[0].with_durations(np.min(durations, axis=0))
        fastest[policy].steps.pop("clock_s")  # the retimed steps' durations replace it
    return fastest


def solo_tokens(model: TinyLlama, request: Request) -> list[int]:
    """The request's output when it runs alone on the contiguous cache of chapter 1 (greedy)."""
    if not isinstance(model, TinyLlama) or not isinstance(request, Request):
        raise KVLibError(
            f"solo_tokens takes a TinyLlama and a Request, not {type(model).__name__} and "
            f"{type(request).__name__}"
        )
    device = model.lm_head.weight.device
    prompt = torch.tensor([list(request.prompt)], device=device)
    with one_cpu_thread(device):
        return generate(model, prompt, request.output_len, "cache").tokens[0, request.prompt_len :].tolist()


def outputs_match_solo(model: TinyLlama, result: RunResult) -> bool:
    """Did every request of a run generate exactly what it generates alone?"""
    if not isinstance(result, RunResult):
        raise KVLibError(f"result must be a RunResult (run_engine's), not {type(result).__name__}")
    return all(seq.generated == solo_tokens(model, seq.request) for seq in result.finished)
