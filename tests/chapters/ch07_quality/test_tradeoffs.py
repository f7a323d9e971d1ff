"""Tests of kvlib.chapters.ch07_quality.tradeoffs: the table of ratios, the Pareto front, row lookup and
bench's
fields (chapter 7). Rows are built by hand; bench runs on a stubbed sweep (the real one takes
90 s and runs in chapter 7 and `python -m kvlib bench --only quality`)."""

import pytest

from kvlib.chapters.ch07_quality import tradeoffs
from kvlib.chapters.ch07_quality.compare import LeverResult
from kvlib.chapters.ch07_quality.tradeoffs import RatioRow, find, pareto_front, ratio_rows
from kvlib.quality.score import Quality


def result(method, setting, kv_bytes, ppl, recall=1.0):
    return LeverResult(method, setting, kv_bytes, Quality(ppl, recall, 10, 1.0))


def row(method, kv_bytes, ppl):
    return RatioRow(method, "s", kv_bytes, kv_bytes / 2048, ppl, 1.0, 1.0)


def test_ratio_rows_divide_by_the_first_result():
    rows = ratio_rows([result("full cache", "fp16", 2048, 4.0), result("int4", "group 16", 768, 5.0, 0.5)])
    assert rows[0].kv_fraction == 1.0 and rows[0].ppl_ratio == 1.0
    assert (
        rows[1].kv_fraction == 768 / 2048 and rows[1].ppl_ratio == 5.0 / 4.0 and rows[1].probe_recall == 0.5
    )


def test_pareto_front_by_hand():
    full, cheap, dominated, middle = (
        row("full", 2048, 1.0),
        row("a", 256, 1.5),
        row("b", 512, 1.6),
        row("c", 512, 1.1),
    )
    # b has more bytes than a and a worse ratio: dominated; c beats b at the same bytes
    assert pareto_front([full, cheap, dominated, middle]) == [cheap, middle, full]
    tie = row("d", 512, 1.1)
    assert pareto_front([middle, tie]) == [middle, tie]  # equal points both stay


def test_find_names_what_it_cannot_find():
    rows = [row("int4", 768, 1.0)]
    assert find(rows, "int4", "s") is rows[0]
    with pytest.raises(KeyError, match="'int8' at 's'"):
        find(rows, "int8", "s")


def test_bench_reports_its_headline_fields(monkeypatch):
    def fake_sweep(model, docs, budgets=tradeoffs.BUDGETS, quant_settings=tradeoffs.QUANT_SETTINGS):
        out = [result("full cache", "fp16", 2048, 4.0)]
        for name, group, residual in quant_settings:
            setting = f"group {group}" + (f", residual {residual}" if residual else "")
            out.append(result(name, setting, 1000, 4.4))
        for g in tradeoffs.POOLED_HEADS:
            for method in ("mean-pooled", "one head kept", "mean-pooled + uptrained"):
                out.append(result(method, f"{g} KV heads", 256 * g, 4.0 + g))
        for b in budgets:
            for policy in ("window", "sinks", "h2o"):
                out.append(result(policy, f"budget {b}", b, 8.0, 0.25))
        return out

    monkeypatch.setattr(tradeoffs, "lever_sweep", fake_sweep)
    monkeypatch.setattr(tradeoffs, "base_model", lambda: None)
    monkeypatch.setattr(tradeoffs, "eval_documents", lambda: None)
    fields = tradeoffs.bench()
    assert set(fields) == {
        "kv_int8_ppl_ratio", "kv_int4_ppl_ratio", "kv_int4_kivi_ppl_ratio", "kv_fp8_ppl_ratio",
        "gqa_meanpool_ppl_ratio", "gqa_uptrained_ppl_ratio", "mqa_uptrained_ppl_ratio",
        "window_ppl_ratio", "sinks_ppl_ratio", "h2o_ppl_ratio",
        "recall_full", "recall_window", "recall_sinks", "recall_h2o",
    }  # fmt: skip
    assert fields["kv_int8_ppl_ratio"] == 4.4 / 4.0
    assert fields["gqa_meanpool_ppl_ratio"] == (4.0 + 2) / 4.0  # 2 KV heads: 4x fewer than 8
    assert fields["mqa_uptrained_ppl_ratio"] == (4.0 + 1) / 4.0
    assert fields["window_ppl_ratio"] == 2.0 and fields["recall_h2o"] == 0.25 and fields["recall_full"] == 1.0
