"""A fast serving simulator: the scheduler of :mod:`kvlib.serving` with a step-time model
instead of a model (chapter 4).

Every step of a real engine runs one forward pass over the sequences the scheduler
picked. :class:`StepTimeModel` predicts its duration from what it computes,

    t_step = fixed_s + per_seq_s x sequences + per_context_s x context tokens read
             + per_prefill_s x prompt tokens prefilled,

with constants fitted to measured steps of ``kvlib.model`` (:func:`kvlib.engine.calibrate`).
:func:`simulate` then serves thousands of requests in seconds and records, at every step,
where each slot of the KV budget is (:data:`kvlib.serving.CATEGORIES`) and how many
sequences run. :class:`RunResult` turns the records into the chapter's numbers.
"""

from __future__ import annotations

from kvlib import KVLibError
from kvlib.serving.placement import make_memory
from kvlib.serving.results import RunResult, result_from
from kvlib.serving.scheduler import Scheduler, SchedulerConfig
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import Request


def simulate(
    requests: list[Request],
    policy: str,
    num_slots: int,
    step_model: StepTimeModel,
    max_len: int = 2048,
    block_size: int = 16,
    config: SchedulerConfig = SchedulerConfig(),
    enable_prefix_caching: bool = False,
    allocator: str = "buddy",
    watermark: float = 0.01,
) -> RunResult:
    """Serve ``requests`` with one policy and a budget of ``num_slots`` token slots; time from ``step_model``.

    Every request completes (requests are never dropped); tokens are placeholders (0),
    since only lengths and timing matter here. ``allocator`` places the reservations of
    ``max``, ``pow2`` and ``oracle``; ``watermark`` is the share of blocks ``paged`` keeps
    free at admission (see :func:`kvlib.placement.make_memory`).
    """
    if not requests:
        raise KVLibError("simulate needs at least one request")
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
    scheduler = Scheduler(memory, requests, config)
    now, durations = 0.0, []
    while scheduler.has_work():
        if not scheduler.running and not scheduler.waiting:
            now = max(now, scheduler.next_arrival())
        plan = scheduler.schedule(now)
        if plan.num_seqs == 0:
            raise KVLibError(
                f"policy {policy}: nothing can run with {num_slots} slots (a request never fits)"
            )
        duration = step_model.step_s(plan)
        now += duration
        durations.append(duration)
        memory.mark_computed(plan)
        scheduler.complete(plan, [0] * plan.num_seqs, now)
    return result_from(scheduler, policy, durations)
