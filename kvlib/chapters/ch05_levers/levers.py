"""Putting the levers together: one model, the levers applied one at a time (chapter 5).

The KV cache of a server depends on three things, each with its levers:

- **how much is cached**: how many layers keep a cache (a hybrid such as Jamba keeps
  attention in one layer of eight; the others are Mamba layers with a fixed-size state);
- **how big each entry is**: KV heads (GQA, MQA), latent attention (MLA), bytes per number
  (fp8, int8 and int4 with their scales);
- **where it is placed**: reserved contiguously for the maximum length, or paged in blocks,
  with a shared prefix stored once (prefix caching).

:func:`apply_lever` applies one lever to a :class:`Variant` and records the factor by which
the lever, by its definition, multiplies the bytes of one token; chapter 5 checks that
:mod:`kvlib.sizing` agrees with the product of these factors exactly. :func:`serve` turns a
variant into what a GPU does with it: the KV budget it leaves (:func:`variant_kv_budget`),
how many full-length sequences fit (:func:`variant_max_batch`), and a step-time model of that
GPU (:func:`variant_step_model`: the book's one roofline model,
:func:`kvlib.serving.roofline.roofline_step`, applied to the variant: a step takes the larger of
its memory time and its compute time) for the simulator of chapter 4
(:func:`kvlib.serving.simulator.simulate`). :func:`chain_table` sets the steps side by side
(drawn by :func:`kvlib.plotting.draw_chain`), with how much of the time the arithmetic takes
(:func:`compute_shares`).

GPU data sheets come from :mod:`kvlib.gpus`; nothing here depends on chapter 4's experiments
(:mod:`kvlib.chapters.ch04_serving.policy_comparison`), only on the serving machinery they use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import reduce

import numpy as np

from kvlib import KVLibError
from kvlib.gpus import A100_40GB, GPU, MEMORY_FRACTION
from kvlib.serving.results import RunResult
from kvlib.serving.roofline import KVBudget, roofline_step
from kvlib.serving.scheduler import SchedulerConfig
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.traces import SHAREGPT, Request, make_trace
from kvlib.serving.types import CATEGORIES
from kvlib.sizing.capacity import free_bytes, kv_budget_bytes, weight_bytes
from kvlib.sizing.catalog import catalog_config, catalog_entry
from kvlib.sizing.dtypes import kv_dtype
from kvlib.sizing.spec import ModelSpec, bytes_per_token, cache_bytes

LEVERS = ("fewer KV heads", "lower precision", "fewer attention layers", "paging", "prefix sharing")

ARCHITECTURE_LEVERS = (
    "fewer KV heads",
    "fewer attention layers",
)  # they change the model: hypothetical variants


@dataclass(frozen=True)
class Variant:
    """One step of the lever chain: a model, how its cache is stored, and how a server places it.

    ``factor`` is what the lever that produced this variant multiplies the bytes of one
    token by, from the lever's definition (1 for placement levers); ``state_bytes`` is a
    fixed per-sequence state that does not grow with the context (Mamba layers).
    """

    name: str  # what this step made of the model ("GQA-8", "fp8 cache", "paged" ...)
    lever: str  # the lever of LEVERS that produced it ("none (baseline)" for the start)
    spec: ModelSpec  # the model's shape, as sizing sees it
    num_parameters: int  # for the weights' bytes (the levers leave them unchanged)
    kv_dtype: str = "fp16"  # storage format of the cache (a name of kvlib.sizing.dtypes.KV_DTYPES)
    policy: str = "max"  # placement policy of kvlib.serving.placement ("max": reserve the maximum length)
    prefix_caching: bool = False  # whether a shared prompt prefix is stored once (paged only)
    state_bytes: int = 0  # fixed per-sequence state (Mamba layers), not growing with the context
    factor: Fraction = Fraction(1)  # this lever's factor on the bytes of one token
    hypothetical: bool = False  # True once a lever changed the architecture (no such trained model)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one more token adds (:func:`kvlib.sizing.spec.bytes_per_token`)."""
        return bytes_per_token(self.spec, self.kv_dtype)

    def sequence_bytes(self, context: int) -> int:
        """Memory one sequence of ``context`` tokens needs: its KV cache plus its fixed state."""
        return cache_bytes(self.spec, context, 1, self.kv_dtype) + self.state_bytes


def base_variant(model: str = "Llama-2-7B") -> Variant:
    """A catalog model as published, fp16 cache, reserved for the maximum length (the chain's start)."""
    entry = catalog_entry(model)
    return Variant(
        f"{entry.name} ({entry.spec.attention_kind}, fp16)",
        "none (baseline)",
        entry.spec,
        entry.num_parameters,
    )


def mamba_state_bytes(
    hidden_size: int,
    num_layers: int,
    d_state: int = 16,
    d_conv: int = 4,
    expand: int = 2,
    dtype_bytes: int = 2,
) -> int:
    """Per-sequence state of ``num_layers`` Mamba layers: ``expand x hidden_size`` channels, each
    keeping the last ``d_conv`` inputs of its convolution and ``d_state`` numbers of its SSM state
    (the layout of transformers' Jamba cache), in 16-bit numbers by default. It does not grow
    with the context, unlike a KV cache."""
    for key, value in (
        ("hidden_size", hidden_size),
        ("d_state", d_state),
        ("d_conv", d_conv),
        ("expand", expand),
        ("dtype_bytes", dtype_bytes),
    ):
        if not isinstance(value, int) or value < 1:
            raise KVLibError(f"{key} must be a positive integer, not {value!r}")
    if not isinstance(num_layers, int) or num_layers < 0:
        raise KVLibError(f"num_layers must be a non-negative integer, not {num_layers!r}")
    return num_layers * expand * hidden_size * (d_conv + d_state) * dtype_bytes


def apply_lever(
    variant: Variant, lever: str, num_kv_heads: int = 8, dtype: str = "fp8", hybrid: str = "Jamba-v0.1"
) -> Variant:
    """``variant`` with one more lever of :data:`LEVERS`, and that lever's factor on the bytes per token.

    - fewer KV heads: ``num_kv_heads`` (GQA; 1 is MQA); factor new heads / old heads;
    - lower precision: the cache stored as ``dtype``; factor the bytes of one stored vector,
      new / old (fp8: 1/2; int8 with its scales: 9/16);
    - fewer attention layers: keep attention only in the layers where ``hybrid``'s config
      (Jamba: ``attn_layer_period`` 8, ``attn_layer_offset`` 4) puts it; the other layers become
      Mamba layers with ``hybrid``'s state sizes; factor new attention layers / old;
    - paging, prefix sharing: where the cache goes, not its size; factor 1.
    """
    spec = variant.spec
    if lever == "fewer KV heads":
        if spec.is_mla:
            raise KVLibError("an MLA model caches one latent per token; it has no KV heads to cut")
        new = spec.with_kv_heads(num_kv_heads)
        return _changed(
            variant, name=_kind(new), lever=lever, spec=new, factor=Fraction(num_kv_heads, spec.num_kv_heads)
        )
    if lever == "lower precision":
        length = spec.cached_vectors[1]
        factor = Fraction(
            kv_dtype(dtype).vector_bytes(length), kv_dtype(variant.kv_dtype).vector_bytes(length)
        )
        return _changed(variant, name=f"{dtype} cache", lever=lever, kv_dtype=dtype, factor=factor)
    if lever == "fewer attention layers":
        config = catalog_config(hybrid)
        period, offset = config["attn_layer_period"], config["attn_layer_offset"]
        layers = tuple(i for i in spec.attention_layers if i % period == offset)
        if not layers:
            raise KVLibError(f"{hybrid}'s pattern leaves none of {spec.name}'s attention layers")
        state = mamba_state_bytes(
            spec.num_heads * spec.head_dim,
            spec.num_layers - len(layers),
            config["mamba_d_state"],
            config["mamba_d_conv"],
            config["mamba_expand"],
        )
        return _changed(
            variant,
            name=f"attention in {len(layers)} of {spec.num_layers} layers",
            lever=lever,
            spec=replace(spec, attention_layers=layers),
            state_bytes=state,
            factor=Fraction(len(layers), spec.num_attention_layers),
        )
    if lever == "paging":
        return _changed(variant, name="paged", lever=lever, policy="paged", factor=Fraction(1))
    if lever == "prefix sharing":
        if variant.policy != "paged":
            raise KVLibError("prefix sharing needs a paged cache: apply paging first")
        return _changed(
            variant, name="paged + prefix caching", lever=lever, prefix_caching=True, factor=Fraction(1)
        )
    raise KVLibError(f"unknown lever {lever!r}; choose from {', '.join(LEVERS)}")


def _changed(variant: Variant, lever: str, **changes) -> Variant:
    """A new variant; it stays hypothetical once a lever has changed the model's architecture."""
    return replace(
        variant, lever=lever, hypothetical=variant.hypothetical or lever in ARCHITECTURE_LEVERS, **changes
    )


def lever_chain(model: str = "Llama-2-7B", levers=LEVERS, **settings) -> list[Variant]:
    """The baseline and the variant after each lever, in order (each builds on the one before)."""
    chain = [base_variant(model)]
    for lever in levers:
        chain.append(apply_lever(chain[-1], lever, **settings))
    return chain


def alone_variants(model: str = "Llama-2-7B", levers=LEVERS, **settings) -> list[Variant]:
    """Each lever applied to the baseline by itself (prefix sharing on top of paging, which it needs)."""
    base = base_variant(model)
    alone = []
    for lever in levers:
        start = apply_lever(base, "paging", **settings) if lever == "prefix sharing" else base
        alone.append(apply_lever(start, lever, **settings))
    return alone


def entry_levers(model: str = "Llama-2-7B", num_kv_heads=(8, 1), mla: str = "DeepSeek-V3") -> list[dict]:
    """Ways to make one cached entry smaller for ``model``'s shape, fp16: GQA/MQA, and MLA with
    ``mla``'s latent (kv_lora_rank + qk_rope_head_dim values per token and layer)."""
    spec = catalog_entry(model).spec
    latent = catalog_entry(mla).spec
    variants = [
        spec,
        *(spec.with_kv_heads(h) for h in num_kv_heads),
        replace(spec, kv_lora_rank=latent.kv_lora_rank, qk_rope_head_dim=latent.qk_rope_head_dim),
    ]
    base = bytes_per_token(spec)
    return [
        {
            "cache per token and layer": _kind(v) + (f" ({v.cached_vectors[1]} values)" if v.is_mla else ""),
            "values per token and layer": v.cached_vectors[0] * v.cached_vectors[1],
            "KV bytes/token": bytes_per_token(v),
            "factor": str(Fraction(bytes_per_token(v), base)),
        }
        for v in variants
    ]


def _kind(spec: ModelSpec) -> str:
    kind = spec.attention_kind
    return f"GQA-{spec.num_kv_heads}" if kind == "GQA" else kind


def cumulative_factors(chain: list[Variant]) -> list[Fraction]:
    """Product of the levers' factors up to each step (1 for the baseline)."""
    return [
        reduce(lambda a, b: a * b, (v.factor for v in chain[1 : i + 1]), Fraction(1))
        for i in range(len(chain))
    ]


def variant_kv_budget(
    variant: Variant,
    gpu: GPU = A100_40GB,
    memory_fraction: float = MEMORY_FRACTION,
    block_size: int = 16,
    max_num_seqs: int = SchedulerConfig().max_num_seqs,
) -> KVBudget:
    """Blocks of KV cache a variant leaves on ``gpu``: (memory x fraction - fp16 weights - the fixed
    states of the ``max_num_seqs`` sequences that may run at once) / bytes per block.

    Chapter 4's :func:`kvlib.serving.roofline.kv_budget`, generalised to any variant and GPU."""
    weights = weight_bytes(variant.num_parameters, "fp16")
    kv = kv_budget_bytes(gpu.memory_bytes, weights + max_num_seqs * variant.state_bytes, memory_fraction)
    per_token = variant.bytes_per_token
    if kv < per_token * block_size:
        raise KVLibError(f"{variant.name} leaves no room for a KV block on the {gpu.name}")
    return KVBudget(
        variant.name, gpu.memory_bytes, weights, kv, per_token, block_size, kv // (per_token * block_size)
    )


def variant_max_batch(
    variant: Variant, context: int, gpu: GPU = A100_40GB, memory_fraction: float = MEMORY_FRACTION
) -> int:
    """Sequences of ``context`` tokens (cache and state each) that fit beside the fp16 weights:
    :func:`kvlib.sizing.capacity.max_batch` with the per-sequence state added."""
    free = free_bytes(int(gpu.memory_bytes * memory_fraction), weight_bytes(variant.num_parameters, "fp16"))
    return max(0, free // variant.sequence_bytes(context))


def variant_step_model(variant: Variant, gpu: GPU = A100_40GB) -> StepTimeModel:
    """The variant's step on ``gpu`` by its data sheet's roofline
    (:func:`kvlib.serving.roofline.roofline_step`, the book's one GPU model): the larger of its
    memory time (the weights, the cached tokens read, each sequence's fixed state read and
    written) and its compute time (2 x parameters FLOPs per token decoded or prefilled), from
    its parameters, its bytes per cached token and its state."""
    return roofline_step(
        variant.num_parameters, variant.bytes_per_token, variant.state_bytes, gpu, variant.name
    )


def chain_trace(
    num_requests: int = 1000, system_prompt_len: int = 256, max_len: int = 4096, seed: int = 0
) -> list[Request]:
    """``num_requests`` requests queued at time 0, each the same ``system_prompt_len``-token system
    prompt followed by a request with chapter 4's ShareGPT-like lengths, so that the whole fits
    in ``max_len`` tokens (the request's own part is drawn up to ``max_len - system_prompt_len``)."""
    if not isinstance(system_prompt_len, int) or not 0 <= system_prompt_len < max_len:
        raise KVLibError(f"a system prompt of {system_prompt_len!r} tokens does not fit in max_len {max_len}")
    spec = replace(SHAREGPT, name="ShareGPT-like", max_len=max_len - system_prompt_len)
    system = tuple(np.random.default_rng([seed, 7]).integers(0, 512, system_prompt_len).tolist())
    return [replace(r, prompt=system + r.prompt) for r in make_trace(spec, num_requests, math.inf, seed=seed)]


def serve(variant: Variant, requests: list[Request], max_len: int = 4096, gpu: GPU = A100_40GB) -> RunResult:
    """Serve ``requests`` with the variant's placement, in the KV budget it leaves on ``gpu``, timed
    by its roofline on that GPU (chapter 4's simulator)."""
    budget = variant_kv_budget(variant, gpu)
    return simulate(
        requests,
        variant.policy,
        budget.num_slots,
        variant_step_model(variant, gpu),
        max_len,
        block_size=budget.block_size,
        enable_prefix_caching=variant.prefix_caching,
    )


def kv_in_use(run: RunResult) -> tuple[float, float]:
    """(KV slots per running sequence, share of the budget allocated) while requests wait.

    Allocated slots hold tokens, are reserved for tokens to come, or are the empty rest of a
    reservation or of a last block; a block shared through prefix caching counts once."""
    steps, busy = run.steps, _waiting(run)
    allocated = sum(steps[c][busy] for c in CATEGORIES if c not in ("external", "free"))
    return float(allocated.sum() / steps["num_seqs"][busy].sum()), float(allocated.mean() / run.num_slots)


def _waiting(run: RunResult) -> np.ndarray:
    """Steps while some request waits (every step if none waits): chapter 4's capacity window."""
    busy = run.steps["num_waiting"] > 0
    return busy if busy.any() else np.ones_like(busy)


def compute_shares(variant: Variant, run: RunResult, gpu: GPU = A100_40GB) -> tuple[float, float]:
    """(share of the step time that the arithmetic alone would take, share that the prompts'
    arithmetic alone would take), over the steps while requests wait, on the variant's roofline.

    A step of :func:`variant_step_model` takes the larger of its memory time and its compute time,
    so the first share is 1 when every step is bound by arithmetic, and small when memory binds
    (the arithmetic then hides under the reading). The second says how much of the time prefill
    takes in compute-bound steps: what a lever that skips prefill (prefix caching) can save."""
    model, steps, busy = variant_step_model(variant, gpu), run.steps, _waiting(run)
    prefill = model.per_prefill_s * steps["prefill_tokens"][busy].sum()
    compute = model.per_seq_s * steps["num_seqs"][busy].sum() + prefill
    total = steps["duration_s"][busy].sum()
    return float(compute / total), float(prefill / total)


def chain_table(
    chain: list[Variant], runs: list[RunResult], context: int, gpu: GPU = A100_40GB
) -> list[dict]:
    """One row per step: bytes per token and per sequence, the factors and capacity (modelled), and the
    simulated server: what a running request holds, the batch, how much of the time the arithmetic
    and the prompts' arithmetic would take alone (:func:`compute_shares`) and the throughput."""
    rows, base = [], runs[0].tokens_per_s
    for i, (variant, run, total) in enumerate(zip(chain, runs, cumulative_factors(chain), strict=True)):
        slots_per_seq, share = kv_in_use(run)
        compute, prefill = compute_shares(variant, run, gpu)
        rows.append(
            {
                "step": i,
                "lever": variant.lever,
                "variant": variant.name + (" (hypothetical)" if variant.hypothetical else ""),
                "factor": str(variant.factor),
                "product of factors": str(total),
                "KV bytes/token": variant.bytes_per_token,
                f"bytes/sequence at {context:,} (MiB)": variant.sequence_bytes(context) / 2**20,
                f"max batch at {context:,}": variant_max_batch(variant, context, gpu),
                "KV budget (token slots)": variant_kv_budget(variant, gpu).num_slots,
                "KV per running sequence (MiB)": slots_per_seq * variant.bytes_per_token / 2**20,
                "budget allocated (%)": 100 * share,
                "mean running batch": run.mean_batch,
                "compute share of the time (%)": 100 * compute,
                "prefill share of the time (%)": 100 * prefill,
                "tokens/s": run.tokens_per_s,
                "x previous": run.tokens_per_s / (runs[i - 1].tokens_per_s if i else base),
                "x baseline": run.tokens_per_s / base,
            }
        )
    return rows
