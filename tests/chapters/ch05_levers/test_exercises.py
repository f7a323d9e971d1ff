"""Chapter 5's exercises beyond tests/test_exercises.py: the answers worked out by hand, first hints
that nudge without giving the number away, and the chapter's decision tables, whose every row
points to the chapter that works it out."""

import re

import nbformat
import pytest

import kvlib.chapters.ch05_levers.exercises as ch5
from kvlib.chapters.exercises import check, first_hint
from tests.toc import ROOT


def test_the_answers_worked_out_by_hand_pass():
    # 5.1: 524,288 x 8/32 KV heads x (128 + 4 x 4) / 256 for int8 with scales x 4/32 layers
    assert check("5.1", 524_288 * 8 // 32 * 144 // 256 * 4 // 32).ok
    assert check("5.1", 9216).ok
    # 5.2: 28 layers x 8,192 channels x (4 + 16) numbers x 2 bytes, over 8,192 bytes per token
    assert check("5.2", 28 * 8192 * 20 * 2 / 8192).ok
    # 5.3: t(b) = max(8.67 ms, b x 43.2 us): 8.67 ms at 128 (the arithmetic, 5.53 ms, hides under the
    # reading), 11.06 ms at 256; (256 / 11.06 ms) / (128 / 8.67 ms)
    assert check("5.3", 1.57).ok
    # 5.4: 247 copies of 256 tokens x 8,192 bytes, in MiB
    assert check("5.4", 494).ok


def test_5_3_names_the_sum_of_the_two_times():
    # t(b) = 8.67 ms + b x 43.2 us, the sum a GPU does not pay: (256 / 19.72 ms) / (128 / 14.20 ms)
    assert "longer of the two" in check("5.3", 1.44).message


def test_a_kv_slots_written_by_hand_passes_5_5():
    def kv_slots(gpu_bytes, num_parameters, bytes_per_token, state_bytes=0):
        left = int(gpu_bytes * 0.9) - 2 * num_parameters - 256 * state_bytes
        return left // (16 * bytes_per_token) * 16

    assert check("5.5", kv_slots).ok


@pytest.mark.parametrize("key", ["5.1", "5.2", "5.3", "5.4"])
def test_a_first_hint_does_not_give_the_number_away(key):
    answer = ch5.EXERCISES[key][1]()
    whole = float(answer).is_integer()
    spelled = {f"{answer:,.0f}", f"{answer:.0f}"} if whole else {f"{answer:.2f}", f"{answer:.1f}"}
    hint = first_hint(key)
    assert not any(re.search(rf"(?<![\d,.]){re.escape(s)}(?![\d,])", hint) for s in spelled), hint


def _markdown(chapter_file: str) -> str:
    cells = nbformat.read(ROOT / "book" / chapter_file, as_version=4).cells
    return "\n".join(c.source for c in cells if c.cell_type == "markdown")


def _table_rows(text: str, header: str) -> list[str]:
    start = text.index(header)
    lines = text[start:].splitlines()
    rows = []
    for line in lines[2:]:  # after the header and the |---| line
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


@pytest.mark.parametrize(
    "header, minimum",
    [("| The article's situation |", 3), ("| Your situation |", 9)],
    ids=["the article's table", "the extended table"],
)
def test_every_row_of_the_decision_tables_links_to_where_it_is_measured(header, minimum):
    rows = _table_rows(_markdown("05_levers.ipynb"), header)
    assert len(rows) >= minimum
    for row in rows:
        backed_by = row.rstrip(" |").rsplit(" | ", 1)[-1]
        links = re.findall(r"\]\(((?:\d\d_\w+\.ipynb)?#?[\w-]*)\)|\{(?:doc|ref)\}`", backed_by)
        assert links, f"no link to the measuring chapter in: {row[:80]}"


def test_the_article_rows_are_backed_by_chapters_2_3_5_and_7():
    rows = _table_rows(_markdown("05_levers.ipynb"), "| The article's situation |")
    linked = " ".join(rows)
    for chapter in ("02_cache_size.ipynb", "03_paged_attention.ipynb", "07_quality.ipynb"):
        assert chapter in linked
    assert "](#serving-the-chain)" in linked  # chapter 5's own measurement


def test_the_mqa_caveat_points_to_chapter_7s_numbers():
    text = _markdown("05_levers.ipynb")
    box = text[text.index("The article's caveat: MQA can cost quality") :].split("\n:::", 1)[0]
    assert "07_quality.ipynb#the-articles-mqa-caveat-revisited" in box
    # MQA's and GQA-4's costs, pasted from chapter 7's sweep, not typed
    assert (
        "{glue:text}`07_quality.ipynb::q_mqa_up:" in box and "{glue:text}`07_quality.ipynb::q_gqa4_up:" in box
    )
