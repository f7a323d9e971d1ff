"""kvlib.checks, the one copy of each argument check: its integer check and how a message shows a value."""

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.checks import is_int, require_int, require_real, shown
from kvlib.cli import main
from kvlib.sizing.widget import calculator_report


@pytest.mark.parametrize("value", [0, -3, 10**30, np.int64(7), np.int8(-1)], ids=str)
def test_is_int_accepts_integers_of_any_kind(value):
    assert is_int(value)


@pytest.mark.parametrize("value", [True, False, 1.0, 1.5, "1", None, [1], float("nan")])
def test_is_int_refuses_bools_floats_and_the_rest(value):
    assert not is_int(value)


def test_require_int_returns_a_plain_int_within_its_range():
    assert type(require_int(np.int64(16), "block_size")) is int
    assert require_int(-5, "position", low=None) == -5
    assert require_int(10, "n", low=1, high=10) == 10


@pytest.mark.parametrize(
    ("value", "low", "high", "words"),
    [
        (0, 1, None, "n must be an integer >= 1, not 0"),
        (11, 1, 10, "n must be an integer from 1 to 10, not 11"),
        (True, None, None, "n must be an integer, not True"),
        (2.0, None, None, "n must be an integer, not 2.0"),
        (10**5000, 1, 10, "n must be an integer from 1 to 10, not an integer of about 5,001 digits"),
    ],
    ids=["below", "above", "bool", "float", "5001-digits"],
)
def test_require_int_names_the_argument_the_value_and_the_range(value, low, high, words):
    with pytest.raises(KVLibError) as error:
        require_int(value, "n", low=low, high=high)
    assert str(error.value) == words


def test_shown_keeps_a_message_short_and_never_fails():
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no repr")

    assert shown(10**5000) == "an integer of about 5,001 digits"  # repr() itself raises ValueError
    assert len(shown(list(range(10**6)))) < 40
    assert len(shown("x" * 10**6)) <= 60
    assert "Hostile" in shown(Hostile())  # a reader's object whose repr fails is named by its type
    assert shown(12) == "12"


def test_a_product_of_parallel_sizes_too_long_to_print_is_refused_by_its_flag(capsys):
    # each flag has 3,000 digits (argparse reads it), their product 6,000: more than Python prints
    huge = "1" + "0" * 3000
    capacity = ["--gpu-memory-gib", "80", "--activation-gib", "2", "--weight-gib", "10"]
    for command in (["size", "--context", "8"], ["capacity", *capacity]):
        args = [command[0], "Llama-3-8B", *command[1:], "--tensor-parallel-size", huge]
        assert main([*args, "--pipeline-parallel-size", huge]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--tensor-parallel-size must be an integer from 1 to" in err


@pytest.mark.parametrize("value", [10**400, -(10**400), 10**5000], ids=["1e400", "-1e400", "1e5000"])
def test_an_integer_beyond_a_floats_range_is_refused_in_one_line(value):
    """math.isfinite, math.isnan and float() raise OverflowError on such an int: the checks do not."""
    with pytest.raises(KVLibError, match="must be a finite number >= 0, not an integer of about"):
        require_real(value, "x")
    for gpu_gib in (value, 8.0):
        overhead = 1.0 if gpu_gib is value else value
        with pytest.raises(KVLibError) as error:
            calculator_report(model="Llama-3-8B", context=8, batch=1, gpu_gib=gpu_gib, overhead_gib=overhead)
        assert "GPU memory" in str(error.value) or "overhead" in str(error.value)
