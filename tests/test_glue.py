"""kvlib.glue: the values the prose pastes are plain numbers and strings that myst-nb can format."""

import numpy as np
import pytest
import torch

from kvlib import KVLibError
from kvlib.glue import glue, plain


@pytest.mark.parametrize(
    "value, expected",
    [
        (np.float64(1.5), 1.5),
        (np.int64(3), 3),
        (torch.tensor(2.5), 2.5),
        (np.bool_(True), True),
        ("never", "never"),
    ],
)
def test_numpy_and_torch_scalars_become_plain_python(value, expected):
    result = plain(value)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None, [1, 2], np.ones(3)])
def test_what_the_prose_cannot_show_is_refused(value):
    with pytest.raises(KVLibError, match="glue"):
        plain(value)


def test_outside_a_notebook_glue_only_checks():
    assert glue(ratio=np.float64(1.25), verdict="holds") is None
    with pytest.raises(KVLibError):
        glue(bad=float("nan"))


def test_glue_exact_rounds_floats_to_12_digits_and_keeps_the_rest():
    from kvlib.glue import glue_exact

    glue_exact(a=0.1 + 0.2, b=3, c="never")  # outside a kernel the values are only checked
    with pytest.raises(KVLibError, match="finite"):
        glue_exact(a=float("nan"))
