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
- ``gpu_model``: a GPU from its data sheet (chapters 4 and 5): the KV budget a model leaves,
  the ideal step time.
- ``results``: :class:`RunResult`, what a run (simulated or real) reports.
- ``simulator``: the scheduler run on a step-time model.
- ``engine``: the real engine: :mod:`kvlib.model` served on the paged cache.
- ``calibration``: the engine's step times measured and fitted into a step-time model.
- ``sharing``: parallel sampling and beam search sharing blocks (copy-on-write).
- ``policy_comparison``: chapter 4's experiments, and ``bench()`` for ``python -m kvlib bench``.

Added for the latency view of chapter 4 and for chapter 8 (each with a ``bench()`` where the
CLI lists it):

- ``swap``: the host pool a swapped-out request's blocks go to, and the transfer time model
  (the scheduler's second preemption mode).
- ``latency``: TTFT, TPOT (p50, p99), the paper's normalised latency, goodput under an SLO.
- ``rate_comparison``: the paper's Figure 12: the request rate each policy sustains at equal
  latency on the A100 OPT-13B model (chapter 4).
- ``speculative``: speculative decoding over the paged cache, with rollback of rejected guesses;
  ``speculative_engine``: the real engine's speculative decoder, and the one budget both caches
  share; ``speculative_bench``: drafts from the target's own layers, acceptance and speed-up.
- ``chunked_prefill``: the token budget of a step against TTFT and the gaps between tokens.
- ``swap_analysis``: swapping against recomputation (the A100 link, the break-even length).
- ``prefix_gain`` and ``prefix_measured``: prefix caching's gain predicted, then simulated.
- ``disaggregation``: the cache under tensor and pipeline parallelism, and the prefill-to-decode
  hand-over of disaggregated serving.
- ``vllm_flags``: every serving knob of kvlib beside the vLLM flag that sets it.
"""
