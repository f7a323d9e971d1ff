"""Serving many requests in one KV budget (chapter 4): scheduler, memory policies, simulator and
a real engine; and what engines do now (chapter 8): latency targets, chunked prefill, swapping,
speculative decoding, prefix caching predicted, the cache over many GPUs.

Modules, bottom to top (each imports only those above it):

- ``traces``: seeded request traces with the vLLM paper's length statistics, :class:`Request`.
- ``types``: what the scheduler and the memory share: :class:`SeqState`, :class:`StepPlan`,
  :class:`StepRecord`, the memory categories (:data:`CATEGORIES`) and the :class:`Memory`
  protocol that every memory policy keeps.
- ``allocators``: contiguous allocators (buddy, first fit) for the reservation policies.
- ``placement``: the memory policies (max, pow2, oracle reservation; paged blocks), :func:`make_memory`.
- ``scheduler``: first-come-first-served continuous batching with preemption by recomputation.
- ``step_time``: the step-time model the simulator's clock uses, and its fit to measured steps.
- ``roofline``: a GPU from its data sheet (chapters 4, 5, 8, 9, 12): the KV budget a model
  leaves, the book's one A100 step model.
- ``results``: :class:`RunResult`, what a run (simulated or real) reports.
- ``simulator``: the scheduler run on a step-time model.
- ``engine``: the real engine: :mod:`kvlib.model` served on the paged cache.
- ``calibration``: the engine's step times measured and fitted into a step-time model.

For the latency view of chapter 4 and for chapter 8:

- ``swap``: the host pool a swapped-out request's blocks go to, and the transfer time model
  (the scheduler's second preemption mode).
- ``latency``: TTFT, TPOT (p50, p99), the paper's normalised latency, goodput under an SLO.
- ``speculative``: speculative decoding over the paged cache, with rollback of rejected guesses;
  ``speculative_engine``: the real engine's speculative decoder, and the one budget both caches
  share.

The chapters' experiments with these (policy comparisons, rates, chunked prefill, swapping
against recomputation, prefix caching, disaggregation, the vLLM flag map) are in
:mod:`kvlib.chapters`.
"""
