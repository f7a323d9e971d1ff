"""The fast serving simulator of chapter 4: the scheduler driven by a step-time model instead of a model.

A real engine (:func:`kvlib.serving.engine.run_engine`) runs one forward pass per step
over the sequences the :class:`~kvlib.serving.scheduler.Scheduler` picked.
:func:`simulate` runs the same scheduler and the same memory policies
(:mod:`kvlib.serving.placement`), but advances its clock by what a
:class:`~kvlib.serving.step_time.StepTimeModel` predicts for each step's plan, and
generates placeholder tokens: only lengths and timing matter. It serves thousands of
requests in seconds and returns a :class:`~kvlib.serving.results.RunResult`, with, at
every step, where each slot of the KV budget is (:data:`~kvlib.serving.types.CATEGORIES`)
and how many sequences run.
"""

from __future__ import annotations

from kvlib import KVLibError
from kvlib.checks import require_int
from kvlib.serving.placement import make_memory
from kvlib.serving.results import RunResult, result_from
from kvlib.serving.scheduler import Scheduler, SchedulerConfig, VictimPolicy
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.swap import HostPool, SwapTimeModel
from kvlib.serving.traces import Request


def simulate(
    requests: list[Request],
    policy: str,
    num_slots: int,
    step_model: StepTimeModel,
    max_len: int = 2048,
    block_size: int = 16,
    config: SchedulerConfig | None = None,
    enable_prefix_caching: bool = False,
    allocator: str = "buddy",
    watermark: float = 0.01,
    swap_model: SwapTimeModel | None = None,
    victim: VictimPolicy | None = None,
) -> RunResult:
    """Serve ``requests`` with one policy and a budget of ``num_slots`` token slots; time from ``step_model``.

    Every request completes (requests are never dropped); tokens are placeholders (0),
    since only lengths and timing matter here. ``allocator`` places the reservations of
    ``max``, ``pow2`` and ``oracle``; ``watermark`` is the share of blocks ``paged`` keeps
    free at admission (see :func:`kvlib.serving.placement.make_memory`). ``config``: the
    scheduler's step limits (default :class:`SchedulerConfig`'s), and chapter 8's chunked
    prefill and swapping. With ``config.preemption_mode="swap"`` a host pool of
    ``config.num_host_blocks`` blocks is counted, and ``swap_model`` (required then: for
    example :func:`kvlib.chapters.ch08_serving_engines.swap_analysis.a100_swap_model`) times each step's
    copies,
    added to the step's time (vLLM copies before the forward pass). ``victim``: a preemption
    policy, a function that takes the running requests that may be preempted (a tuple of
    :class:`~kvlib.serving.types.SeqState`, oldest first) and returns the one to preempt; None
    keeps first come, first served's choice, the youngest (:meth:`Scheduler.victim`).
    """
    requests = checked_requests(requests)
    if not isinstance(step_model, StepTimeModel):
        raise KVLibError(f"step_model must be a StepTimeModel, not {type(step_model).__name__}")
    if step_model.fixed_s + step_model.per_seq_s <= 0:
        raise KVLibError(
            "step_model: fixed_s + per_seq_s must be > 0, or a step takes no time and the clock stands still"
        )
    if config is not None and not isinstance(config, SchedulerConfig):
        raise KVLibError(f"config must be a SchedulerConfig or None, not {type(config).__name__}")
    config = SchedulerConfig() if config is None else config
    if swap_model is not None and not isinstance(swap_model, SwapTimeModel):
        raise KVLibError(f"swap_model must be a SwapTimeModel or None, not {type(swap_model).__name__}")
    if config.preemption_mode == "swap" and swap_model is None:
        raise KVLibError("preemption_mode 'swap' needs a swap_model to time the copies (a SwapTimeModel)")
    max_len = require_int(max_len, "max_len")
    longest = max(r.total_len for r in requests)
    if longest > max_len:
        raise KVLibError(f"a request of {longest} tokens exceeds max_len {max_len}")
    memory = make_memory(
        policy,
        num_slots,
        max_len,
        block_size,
        enable_prefix_caching=enable_prefix_caching,
        allocator=allocator,
        watermark=watermark,
    )
    host = HostPool(config.num_host_blocks, block_size) if config.preemption_mode == "swap" else None
    scheduler = Scheduler(memory, requests, config, host, victim)
    now, durations = 0.0, []
    while scheduler.has_work():
        if not scheduler.running and not scheduler.waiting and not scheduler.swapped:
            now = max(now, scheduler.next_arrival())
        plan = scheduler.schedule(now)
        if plan.num_seqs == 0:  # the checks above and make_memory's leave no known way here
            raise KVLibError(
                f"policy {policy}: nothing can run with {num_slots} slots (a request never fits)"
            )
        duration = step_model.step_s(plan)
        if plan.swaps:
            duration += swap_model.step_s(plan.swaps)
        now += duration
        durations.append(duration)
        memory.mark_computed(plan)
        scheduler.complete(plan, [0] * len(plan.seqs), now)
    return result_from(scheduler, policy, durations)


def checked_requests(requests) -> list[Request]:
    """``requests`` as a list, once it is checked to hold at least one :class:`Request`, each id once.

    Two requests with one ``req_id`` would share one entry of every memory's tables (one
    frees the other's blocks): a KVLibError, not a corrupted run. Each request's own fields
    (``output_len >= 1``, a finite arrival, a prompt) are checked when it is made.
    """
    try:
        requests = list(requests)
    except TypeError:
        raise KVLibError(f"requests must be a list of Request, not {type(requests).__name__}") from None
    if not requests:
        raise KVLibError("simulate needs at least one request")
    strangers = [r for r in requests if not isinstance(r, Request)]
    if strangers:
        raise KVLibError(f"requests must be Request objects, not {type(strangers[0]).__name__}")
    ids = [r.req_id for r in requests]
    if len(set(ids)) < len(ids):
        seen: set[int] = set()
        twice = next(i for i in ids if i in seen or seen.add(i))
        raise KVLibError(f"req_id {twice} is used by more than one request: ids must be unique")
    return requests
