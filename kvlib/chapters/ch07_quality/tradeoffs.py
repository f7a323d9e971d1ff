"""Chapter 7's sweep: every lossy lever on the trained model, one table, one Pareto front, ``bench``.

:func:`lever_sweep` runs :mod:`kvlib.chapters.ch07_quality.compare` over the settings below on the validation
documents and returns one :class:`~kvlib.chapters.ch07_quality.compare.LeverResult` per setting, the full
cache first. :func:`ratio_rows` turns them into the practitioner's table (KV bytes per token and
their fraction of the full cache, perplexity ratio, probe recall, greedy agreement), and
:func:`pareto_front` keeps the settings no other setting beats on both bytes and perplexity.
``python -m kvlib bench --only quality`` reports the headline ratios (:func:`bench`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib.chapters.ch07_quality.compare import LeverResult, evicted, fewer_heads, full_cache, quantized
from kvlib.model.llama import TinyLlama
from kvlib.train.checkpoint import WEIGHTS_DIR, load_model
from kvlib.train.corpus import Documents, documents
from kvlib.train.trainer import VALIDATION_SEED

NUM_EVAL_DOCS = 32  # validation documents (32 x 512 tokens; 122 late queries)
BUDGETS = (64, 128, 256)  # eviction budgets in tokens; 128 is a quarter of the 512-token document
QUARTER_BUDGET = 128  # the budget bench reports: a quarter of the full cache's tokens
# (format, group size, residual length): per-token int8/int4/int2 and fp8 over one head's 16 values,
# int4 in groups of 8, and KIVI with the paper's residual of 128 tokens and a short one of 32
QUANT_SETTINGS = (
    ("int8", 16, None),
    ("fp8", 16, None),
    ("int4", 16, None),
    ("int4", 8, None),
    ("int2", 16, None),
    ("kivi4", 16, 128),
    ("kivi4", 16, 32),
    ("kivi2", 16, 128),
)
POOLED_HEADS = (4, 2, 1)  # K/V heads after conversion: GQA-4, GQA-2 (4x fewer), MQA
# the uptrained conversions in WEIGHTS_DIR, by K/V heads: mean-pooled, and one head kept per group
UPTRAINED_FILES = {4: "kv4.safetensors", 2: "kv2.safetensors", 1: "kv1.safetensors"}
KEPT_UPTRAINED_FILES = {4: "kv4_kept.safetensors", 2: "kv2_kept.safetensors", 1: "kv1_kept.safetensors"}
BASE_FILE = "mha.safetensors"  # the trained multi-head model, in WEIGHTS_DIR


@dataclass(frozen=True)
class RatioRow:
    """One line of chapter 7's table: a setting against the full cache."""

    method: str  # the lever, e.g. "int4", "GQA mean-pooled + uptrained", "h2o"
    setting: str  # its knob
    kv_bytes_per_token: float  # KV bytes held per token of context, fp16 reference = 2 bytes per value
    kv_fraction: float  # kv_bytes_per_token / the full cache's
    ppl_ratio: float  # perplexity / the full cache's (1.0 = no loss)
    probe_recall: float  # late queries answered right (the full cache's is the reference)
    agreement: float  # greedy next tokens equal to the full cache's


def base_model() -> TinyLlama:
    """The shipped multi-head model (``python -m kvlib train``), checksum verified."""
    return load_model(WEIGHTS_DIR / BASE_FILE)


def eval_documents(num_docs: int = NUM_EVAL_DOCS) -> Documents:
    """The validation documents every lever is scored on (never trained on)."""
    return documents(num_docs, VALIDATION_SEED)


def lever_sweep(
    model: TinyLlama, docs: Documents, budgets=BUDGETS, quant_settings=QUANT_SETTINGS
) -> list[LeverResult]:
    """Every setting of every lever on ``docs``, the full cache first."""
    reference_result, reference = full_cache(model, docs)
    results = [reference_result]
    for name, group, residual in quant_settings:
        results.append(quantized(model, docs, reference, name, group, residual))
    for heads in POOLED_HEADS:
        results.append(fewer_heads(model, docs, reference, "mean-pooled", heads, "mean"))
        results.append(fewer_heads(model, docs, reference, "one head kept", heads, "keep"))
        uptrained = load_model(WEIGHTS_DIR / UPTRAINED_FILES[heads])
        results.append(fewer_heads(uptrained, docs, reference, "mean-pooled + uptrained"))
        kept_uptrained = load_model(WEIGHTS_DIR / KEPT_UPTRAINED_FILES[heads])
        results.append(fewer_heads(kept_uptrained, docs, reference, "one head kept + uptrained"))
    for budget in budgets:
        for policy in ("window", "sinks", "h2o"):
            results.append(evicted(model, docs, reference, policy, budget))
    return results


def ratio_rows(results: list[LeverResult]) -> list[RatioRow]:
    """Each result against the first (the full cache)."""
    full = results[0]
    return [
        RatioRow(
            r.method,
            r.setting,
            r.kv_bytes_per_token,
            r.kv_bytes_per_token / full.kv_bytes_per_token,
            r.quality.perplexity / full.quality.perplexity,
            r.quality.probe_recall,
            r.quality.agreement,
        )
        for r in results
    ]


def pareto_front(rows: list[RatioRow]) -> list[RatioRow]:
    """The rows no other row beats: none has fewer bytes and a lower perplexity ratio (ties kept)."""
    front = [
        r
        for r in rows
        if not any(
            o.kv_bytes_per_token <= r.kv_bytes_per_token
            and o.ppl_ratio <= r.ppl_ratio
            and (o.kv_bytes_per_token, o.ppl_ratio) != (r.kv_bytes_per_token, r.ppl_ratio)
            for o in rows
        )
    ]
    return sorted(front, key=lambda r: r.kv_bytes_per_token)


def find(rows: list[RatioRow], method: str, setting: str) -> RatioRow:
    """The row of ``method`` at ``setting`` (a KeyError naming both if the sweep has none)."""
    for r in rows:
        if r.method == method and r.setting == setting:
            return r
    raise KeyError(f"no row {method!r} at {setting!r}")


def decision_costs(rows: list[RatioRow]) -> dict:
    """The quality costs chapter 5's decision table quotes, from this sweep's rows: the perplexity
    rise over the full cache's (ratio - 1) and the probe recall of each lever it names (chapter 7
    glues them; chapter 5 pastes them from there instead of running the sweep again)."""

    def cost(method: str, setting: str) -> tuple[float, float]:
        row = find(rows, method, setting)
        return row.ppl_ratio - 1, row.probe_recall

    quarter = f"budget {QUARTER_BUDGET}"
    bits84 = [cost(method, "group 16") for method in ("int8", "fp8", "int4")]
    values = {
        "q_full_recall": rows[0].probe_recall,
        "q_bits84": max(c for c, _ in bits84),
        "q_recall84": min(r for _, r in bits84),
        "q_int2": cost("int2", "group 16")[0],
        "q_kivi2": cost("kivi2", "group 16, residual 128")[0],
        "q_gqa4_pooled": cost("mean-pooled", "4 KV heads")[0] + 1,
    }
    for heads, name in ((4, "gqa4"), (2, "gqa2"), (1, "mqa")):
        values[f"q_{name}_up"], values[f"q_{name}_up_recall"] = cost(
            "mean-pooled + uptrained", f"{heads} KV heads"
        )
    for policy in ("window", "sinks", "h2o"):
        values[f"q_{policy}"], values[f"q_{policy}_recall"] = cost(policy, quarter)
    return values


def bench() -> dict:
    """The headline ratios against the full-precision full cache, on the shipped weights."""
    rows = ratio_rows(lever_sweep(base_model(), eval_documents(), budgets=(QUARTER_BUDGET,)))
    at_quarter = f"budget {QUARTER_BUDGET}"
    return {
        "kv_int8_ppl_ratio": find(rows, "int8", "group 16").ppl_ratio,
        "kv_int4_ppl_ratio": find(rows, "int4", "group 16").ppl_ratio,
        "kv_int4_kivi_ppl_ratio": find(rows, "kivi4", "group 16, residual 128").ppl_ratio,
        "kv_fp8_ppl_ratio": find(rows, "fp8", "group 16").ppl_ratio,
        "gqa_meanpool_ppl_ratio": find(rows, "mean-pooled", "2 KV heads").ppl_ratio,
        "gqa_uptrained_ppl_ratio": find(rows, "mean-pooled + uptrained", "2 KV heads").ppl_ratio,
        "mqa_uptrained_ppl_ratio": find(rows, "mean-pooled + uptrained", "1 KV heads").ppl_ratio,
        "window_ppl_ratio": find(rows, "window", at_quarter).ppl_ratio,
        "sinks_ppl_ratio": find(rows, "sinks", at_quarter).ppl_ratio,
        "h2o_ppl_ratio": find(rows, "h2o", at_quarter).ppl_ratio,
        "recall_full": rows[0].probe_recall,
        "recall_window": find(rows, "window", at_quarter).probe_recall,
        "recall_sinks": find(rows, "sinks", at_quarter).probe_recall,
        "recall_h2o": find(rows, "h2o", at_quarter).probe_recall,
    }
