"""The NumPy reproduction of the article's experiment (kvlib.article)."""

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.article import ARTICLE_FIGURES, ArticleSetup, loop_with_cache, loop_without_cache, reproduce


def test_both_loops_compute_the_same_last_output():
    setup = ArticleSetup.draw(12, d_model=16, num_layers=3, seed=1)
    a, b = loop_without_cache(setup), loop_with_cache(setup)
    assert a.shape == (1, 16)
    assert np.allclose(a, b, rtol=1e-10, atol=0)


def test_the_last_output_is_attention_of_the_last_token_in_the_last_layer():
    setup = ArticleSetup.draw(5, d_model=8, num_layers=2, seed=2)
    w_q, w_k, w_v = setup.weights[-1]
    x = setup.inputs
    expected = ((x[-1:] @ w_q) @ (x @ w_k).T) @ (x @ w_v)
    assert np.allclose(loop_with_cache(setup), expected)


def test_setups_are_seeded():
    a, b, c = ArticleSetup.draw(4, 8, 1, seed=0), ArticleSetup.draw(4, 8, 1, seed=0), ArticleSetup.draw(4, 8, 1, seed=1)
    assert np.array_equal(a.inputs, b.inputs) and not np.array_equal(a.inputs, c.inputs)


def test_reproduce_reports_each_length():
    runs = reproduce(lengths=(5, 10), repeats_without=1, repeats_with=2)
    assert [r.num_tokens for r in runs] == [5, 10]
    assert all(r.same_output and r.speedup > 0 for r in runs)


def test_article_figures_are_its_table():
    assert sorted(ARTICLE_FIGURES) == [100, 200, 400]
    for slow, fast, speedup in ARTICLE_FIGURES.values():
        assert abs(slow / fast - speedup) < 0.1  # the article's speedups are its times' ratios, rounded


@pytest.mark.parametrize("kwargs", [dict(num_tokens=0), dict(num_tokens=3, d_model=0), dict(num_tokens=3, num_layers=1.5)])
def test_bad_sizes_are_named(kwargs):
    with pytest.raises(KVLibError, match="must be a positive integer"):
        ArticleSetup.draw(**kwargs)
