"""A hostile round on kvlib.measure.timing: each bad argument is a one-line KVLibError naming it, and
no argument makes a timing run without end. Found: time_it(repeats=10**12) (and number=10**12)
ran on for ever; time_it(None) was a TypeError at the first call, device="x" a RuntimeError from
torch; torch_threads(0) a RuntimeError; read_clock("x") silently read the wall clock; synchronize("x")
and clock_for("x", 1) were RuntimeErrors; time_interleaved of a list, of a non-function or of a NaN
target were TypeErrors or ran; round_median of a non-Timing an AttributeError."""

from __future__ import annotations

import math

import pytest

from kvlib import KVLibError
from kvlib.measure import timing


def one_line(call, *words):
    with pytest.raises(KVLibError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and len(message) < 300 and all(w in message for w in words), message


def nothing():
    return None


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: timing.time_it(None), ("fn",)),
        (lambda: timing.time_it(nothing, repeats=0), ("repeats",)),
        (lambda: timing.time_it(nothing, repeats=math.nan), ("repeats",)),
        (lambda: timing.time_it(nothing, repeats=10**12), ("repeats", "10,000")),
        (lambda: timing.time_it(nothing, warmup=-1), ("warmup",)),
        (lambda: timing.time_it(nothing, number=0), ("number",)),
        (lambda: timing.time_it(nothing, number=10**12), ("number", "10,000,000")),
        (lambda: timing.time_it(nothing, number=True), ("number",)),
        (lambda: timing.time_it(nothing, clock="x"), ("clock",)),
        (lambda: timing.time_it(nothing, device="x"), ("device", "'x'")),
        (lambda: timing.time_interleaved({}), ("at least one function",)),
        (lambda: timing.time_interleaved(None), ("fns",)),
        (lambda: timing.time_interleaved([nothing]), ("fns", "list")),
        (lambda: timing.time_interleaved({"a": 5}), ("fns",)),
        (lambda: timing.time_interleaved({"a": nothing}, rounds=0), ("rounds",)),
        (lambda: timing.time_interleaved({"a": nothing}, rounds=10**12), ("rounds",)),
        (lambda: timing.time_interleaved({"a": nothing}, target_s=math.nan), ("target_s",)),
        (lambda: timing.time_interleaved({"a": nothing}, target_s=-1), ("target_s",)),
        (lambda: timing.time_interleaved({"a": nothing}, target_s=1e9), ("target_s",)),
        (lambda: timing.time_interleaved({"a": nothing}, number=-1), ("number",)),
        (lambda: timing.time_interleaved({"a": nothing}, clock="x"), ("clock",)),
        (lambda: timing.time_interleaved({"a": nothing}, device="x"), ("device",)),
        (lambda: timing.torch_threads(0).__enter__(), ("threads",)),
        (lambda: timing.torch_threads(-1).__enter__(), ("threads",)),
        (lambda: timing.torch_threads(math.nan).__enter__(), ("threads",)),
        (lambda: timing.torch_threads(10**6).__enter__(), ("threads",)),
        (lambda: timing.torch_threads("2").__enter__(), ("threads",)),
        (lambda: timing.pick_device("x"), ("device",)),
        (lambda: timing.pick_device(5), ("device",)),
        (lambda: timing.read_clock("x"), ("clock",)),
        (lambda: timing.read_clock(None), ("clock",)),
        (lambda: timing.clock_for("x", 1), ("device",)),
        (lambda: timing.clock_for("cpu", -1), ("threads",)),
        (lambda: timing.clock_for(None, 1), ("device",)),
        (lambda: timing.synchronize("x"), ("device",)),
        (lambda: timing.synchronize(5), ("device",)),
        (lambda: timing.round_median(lambda: 1.0), ("same number of rounds",)),
        (lambda: timing.round_median(lambda a: a, 5), ("Timing",)),
        (lambda: timing.round_median(None, timing.Timing(1, 1, 1, (1,))), ("function",)),
    ],
)
def test_timing_helpers_name_their_bad_arguments(call, words):
    one_line(call, *words)


def test_the_checked_helpers_still_time():
    result = timing.time_it(nothing, repeats=3, number=2, device="cpu")
    assert len(result.samples) == 3 and result.min_s >= 0
    both = timing.time_interleaved({"a": nothing, "b": nothing}, rounds=2, target_s=0, device="cpu")
    assert set(both) == {"a", "b"} and all(len(t.samples) == 2 for t in both.values())
    assert timing.clock_for("cpu", 1) == "thread" and timing.clock_for("cpu", None) == "wall"
