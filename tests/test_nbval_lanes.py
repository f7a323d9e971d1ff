"""make nbval's two lanes: every notebook of the book is checked, once, in one lane."""

from pathlib import Path

from tests import nbval_lanes
from tests.toc import ROOT, toc_notebooks


def test_every_notebook_is_in_exactly_one_lane():
    lanes = nbval_lanes.lanes()
    listed = [notebook for notebooks in lanes.values() for notebook in notebooks]
    assert sorted(listed) == sorted(p.relative_to(ROOT).as_posix() for p in toc_notebooks())
    assert len(listed) == len(set(listed))


def test_the_compute_lane_names_real_notebooks():
    stems = {p.stem for p in toc_notebooks()}
    assert set(nbval_lanes.COMPUTE) <= stems, set(nbval_lanes.COMPUTE) - stems
    assert all(Path(n).stem in nbval_lanes.COMPUTE for n in nbval_lanes.lanes()["compute"])


def test_an_unknown_lane_is_refused_in_one_line(capsys):
    assert nbval_lanes.main(["--lane", "fast"]) == 2
    assert "--lane takes one of timing, compute" in capsys.readouterr().err
