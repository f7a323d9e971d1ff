"""Chapter 8's speculative-decoding measurements: a draft made from the target, acceptance against
``k``, the speed-up and the per-pass costs that explain it.

The target is chapter 7's trained model (``kvlib/train/weights/mha.safetensors``), whose corpus
(:mod:`kvlib.train.corpus`) is regular enough for a cheap model to guess its next token. The
draft is the target itself with layers left out, trained no further: the embedding, some of its
layers in order, the final norm and the output head. Its first layers alone are *early-exit*
drafting (LayerSkip: Elhoushi et al. 2024, "LayerSkip: Enabling Early Exit Inference and
Self-Speculative Decoding", which trains the model so that early layers can exit); keeping the
last layer and skipping middle ones is *layer-skip* drafting (Zhang et al. 2023, "Draft &
Verify: Lossless Large Language Model Acceleration via Self-Speculative Decoding"). Since
nothing is trained, the draft shares the target's weights and costs no memory but its own
KV cache, which :class:`~kvlib.serving.speculative.SpecRun` counts in ``kv_bytes``.

Speed is measured, never asserted in tests: :func:`measure_speedup` times plain greedy
decoding against speculative decoding, interleaved, on the thread's CPU clock
(:func:`kvlib.measure.time_interleaved`); :func:`pass_costs` times the three kinds of pass so
that :func:`predicted_speedup` can say where the time goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.measure.timing import round_median, time_interleaved, torch_threads
from kvlib.model.llama import TinyLlama
from kvlib.paged.block_manager import num_blocks_for
from kvlib.paged.decode_loop import generate_paged
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.serving.speculative import SpecRun, generate_speculative
from kvlib.train.checkpoint import WEIGHTS_DIR, load_model
from kvlib.train.corpus import documents
from kvlib.train.trainer import VALIDATION_SEED

DRAFT_LAYERS = (0, 3)  # the layer-skip draft of chapter 8: the target's first and last layers
EARLY_EXIT_LAYERS = (0, 1)  # the early-exit draft: its first two layers
KS = (1, 2, 3, 4, 5, 6)  # guesses per round swept
PROMPT_LEN = 96  # tokens of each corpus document given as the prompt
NUM_NEW = 64  # tokens generated after it


def layer_draft(model: TinyLlama, layers: Iterable[int]) -> TinyLlama:
    """A draft model made of some of ``model``'s layers (in order), its embedding, final norm and head.

    Of ``model``'s class (a :class:`~kvlib.model.lean.LeanLlama` gives a lean draft). The weights are
    copied, not trained: ``layers=range(n)`` is early exit after ``n`` layers,
    ``(0, num_layers - 1)`` skips the middle ones.
    """
    if not isinstance(model, TinyLlama):
        raise KVLibError(f"model must be a kvlib TinyLlama, not {type(model).__name__}")
    layers = list(layers)
    num_layers = model.config.num_layers
    if not layers or layers != sorted(set(layers)) or not all(0 <= i < num_layers for i in layers):
        raise KVLibError(
            f"layers must be distinct increasing layer indices in 0 .. {num_layers - 1}: {layers}"
        )
    draft = type(model)(dataclasses.replace(model.config, num_layers=len(layers)))  # lean if model is
    state = {}
    for name, tensor in model.state_dict().items():
        if not name.startswith("layers."):
            state[name] = tensor
            continue
        index, rest = name.removeprefix("layers.").split(".", 1)
        if int(index) in layers:
            state[f"layers.{layers.index(int(index))}.{rest}"] = tensor
    draft.load_state_dict(state)
    return draft.to(model.lm_head.weight.device).eval()


def corpus_prompts(num_docs: int = 3, prompt_len: int = PROMPT_LEN) -> list[list[int]]:
    """The first ``prompt_len`` tokens of chapter 7's first ``num_docs`` validation documents."""
    return documents(num_docs, VALIDATION_SEED).tokens[:, :prompt_len].tolist()


@dataclass(frozen=True)
class SweepRow:
    """Speculative decoding with ``k`` guesses per round, summed over the prompts of a sweep."""

    k: int  # guesses per round
    acceptance_rate: float  # guesses kept / guesses verified
    tokens_per_target_pass: float  # generated tokens / target forward passes (prefills included)
    num_target_passes: int  # target forward passes
    num_draft_passes: int  # draft forward passes
    kv_bytes: int  # the largest of the runs' target + draft cache peaks
    tokens_identical: bool  # every prompt's tokens equal plain greedy decoding


def acceptance_sweep(
    target: TinyLlama,
    draft: TinyLlama,
    prompts: Sequence[Sequence[int]],
    num_new: int = NUM_NEW,
    ks: Iterable[int] = KS,
    block_size: int = 16,
) -> list[SweepRow]:
    """One :class:`SweepRow` per ``k``: acceptance, tokens per target pass, passes, bytes, identity."""
    if not prompts:
        raise KVLibError("acceptance_sweep needs at least one prompt")
    with torch_threads(1):
        plain = [generate_paged(target, [p], num_new, block_size).tokens[0] for p in prompts]
        rows = []
        for k in ks:
            runs = [generate_speculative(target, draft, p, num_new, k, block_size) for p in prompts]
            rows.append(_row(k, runs, plain))
    return rows


def _row(k: int, runs: list[SpecRun], plain: list[list[int]]) -> SweepRow:
    proposed = sum(r.num_proposed for r in runs)
    target_passes = sum(r.num_target_passes for r in runs)
    return SweepRow(
        k=k,
        acceptance_rate=sum(r.num_accepted for r in runs) / proposed if proposed else 0.0,
        tokens_per_target_pass=sum(r.num_new for r in runs) / target_passes,
        num_target_passes=target_passes,
        num_draft_passes=sum(r.num_draft_passes for r in runs),
        kv_bytes=max(r.kv_bytes for r in runs),
        tokens_identical=all(r.tokens == p for r, p in zip(runs, plain, strict=True)),
    )


def measure_speedup(
    target: TinyLlama,
    draft: TinyLlama,
    prompts: Sequence[Sequence[int]],
    num_new: int = NUM_NEW,
    ks: Iterable[int] = KS,
    rounds: int = 5,
) -> dict[int, float]:
    """Plain greedy time / speculative time for each ``k``, on one thread, the runs interleaved.

    A sample decodes every prompt alone, one after the other. Each round times every function
    once (its order rotating); a ratio is the median over the rounds of the ratio within a
    round (:func:`kvlib.measure.round_median`), so load that lasts a round cancels.
    """
    if not prompts:
        raise KVLibError("measure_speedup needs at least one prompt")

    def plain():
        for prompt in prompts:
            generate_paged(target, [prompt], num_new)

    def speculative(k: int):
        for prompt in prompts:
            generate_speculative(target, draft, prompt, num_new, k)

    fns = {"plain": plain} | {k: lambda k=k: speculative(k) for k in ks}
    with torch_threads(1):
        timings = time_interleaved(fns, rounds, number=1, device=torch.device("cpu"))
    plain_timing = timings.pop("plain")
    return {k: round_median(lambda p, s: p / s, plain_timing, t) for k, t in timings.items()}


@dataclass(frozen=True)
class PassCosts:
    """Seconds per forward pass at one context length, on one thread (medians over interleaved rounds)."""

    target_decode_s: float  # the target over 1 new token: a plain decode step
    target_verify_s: float  # the target over k + 1 new tokens: one verification
    draft_decode_s: float  # the draft over 1 new token: one guess
    k: int  # guesses the verification covered

    @property
    def verify_ratio(self) -> float:
        """A verification's cost in decode steps (about 1 where a pass is bound by reading the weights)."""
        return self.target_verify_s / self.target_decode_s

    @property
    def draft_ratio(self) -> float:
        """A guess's cost in decode steps of the target."""
        return self.draft_decode_s / self.target_decode_s


def _pass_timer(model: TinyLlama, context: Sequence[int], num_new: int):
    """A function that runs ``model`` over the last ``num_new`` of ``context`` on a paged cache, again
    and again: each call first releases the slots the previous one wrote (a rollback)."""
    cache = PagedKVCache.for_model(model, num_blocks_for(len(context), 16), 16, enable_prefix_caching=False)
    num_cached = len(context) - num_new
    tokens = list(context[:num_cached])
    cache.manager.allocate(0, tokens)
    cache.schedule([0])
    model(torch.tensor([tokens]), cache)  # the cached context's K/V
    tokens += context[num_cached:]
    rows = torch.tensor([tokens[num_cached:]])  # (1, num_new)

    def run():
        cache.manager.truncate(0, num_cached)
        while cache.manager.num_tokens(0) < len(tokens):
            cache.manager.append_slot(0)
        cache.schedule([0])
        model(rows, cache, last_only=num_new == 1)

    return run


@torch.inference_mode()
def pass_costs(
    target: TinyLlama, draft: TinyLlama, context: Sequence[int], k: int, rounds: int = 7
) -> PassCosts:
    """Time a target decode step, a target verification over ``k + 1`` tokens and a draft step.

    ``context`` holds the tokens already cached plus the pass's new ones (at least ``k + 2``).
    The three are timed in interleaved rounds (:func:`kvlib.measure.time_interleaved`).
    """
    if len(context) < k + 2:
        raise KVLibError(f"the context needs at least k + 2 = {k + 2} tokens, not {len(context)}")
    fns = {
        "target_decode": _pass_timer(target, context, 1),
        "target_verify": _pass_timer(target, context, k + 1),
        "draft_decode": _pass_timer(draft, context, 1),
    }
    with torch_threads(1):
        timings = time_interleaved(fns, rounds, warmup=5, device=torch.device("cpu"))
    return PassCosts(*(timings[name].median_s for name in fns), k=k)


def predicted_speedup(costs: PassCosts, row: SweepRow, num_new: int, num_prompts: int) -> float:
    """Plain decoding's passes times a decode step over a speculative run's passes at their costs.

    Prefills are left out of both (the same for the two); ``row`` gives the passes over
    ``num_prompts`` prompts of ``num_new`` tokens each, the costs their price.
    """
    plain_s = num_prompts * (num_new - 1) * costs.target_decode_s
    rounds = row.num_target_passes - num_prompts
    spec_s = rounds * costs.target_verify_s + row.num_draft_passes * costs.draft_decode_s
    return plain_s / spec_s


def bench() -> dict:
    """Chapter 8's speculative-decoding numbers for ``python -m kvlib bench --json``.

    The layer-skip draft on three corpus prompts: tokens identical to plain greedy decoding
    for every ``k``, the measured speed-up at the fastest ``k`` (plain time / speculative
    time; below 1 means slower, as on a CPU at this size), that ``k`` and its acceptance rate.
    """
    target = load_model(WEIGHTS_DIR / "mha.safetensors")
    draft = layer_draft(target, DRAFT_LAYERS)
    prompts = corpus_prompts()
    rows = {row.k: row for row in acceptance_sweep(target, draft, prompts)}
    speedups = measure_speedup(target, draft, prompts)
    best_k = max(speedups, key=speedups.get)
    return {
        "spec_decode_tokens_identical": all(row.tokens_identical for row in rows.values()),
        "spec_decode_speedup": speedups[best_k],
        "spec_decode_best_k": best_k,
        "spec_decode_acceptance": rows[best_k].acceptance_rate,
    }
