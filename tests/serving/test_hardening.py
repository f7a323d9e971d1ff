"""Bad input to chapter 4's simulator, traces and step-time model is a one-line KVLibError naming the
value, never a hang, a raw numpy error or a silently wrong number."""

import math
import signal

import numpy as np
import pytest

from kvlib import KVLibError
from kvlib.serving.placement import BlockCounter, PagedMemory, ReservedMemory, make_memory
from kvlib.serving.scheduler import SchedulerConfig
from kvlib.serving.simulator import simulate
from kvlib.serving.step_time import StepTimeModel, fit_step_time
from kvlib.serving.traces import ALPACA, Request, TraceSpec, make_trace, sample_lengths

STEP = StepTimeModel(0.01, 1e-4, 1e-6, 1e-5)
ONE = [Request(0, 0.0, (1, 2, 3), 4)]


@pytest.fixture
def no_hang():
    """Fail (instead of hanging the suite) if the code under test runs for more than 10 seconds."""

    def stop(*_):
        raise TimeoutError("the call did not return within 10 s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------- requests


@pytest.mark.parametrize("output_len", [0, -1, 2.0, True, None])
def test_a_request_needs_at_least_one_output_token(output_len):
    with pytest.raises(
        KVLibError, match=r"request 0: output_len \(vLLM's max_tokens\) must be an integer >= 1"
    ):
        Request(0, 0.0, (1, 2, 3), output_len)


@pytest.mark.parametrize("policy", ["max", "pow2", "oracle", "paged"])
def test_output_len_0_no_longer_hangs_the_simulator(policy, no_hang):
    """It grew memory forever under the reservation policies: now the request cannot be made."""
    with pytest.raises(KVLibError, match="output_len"):
        simulate([Request(0, 0.0, (1, 2, 3), 0)], policy, 4096, STEP)


@pytest.mark.parametrize("arrival", [math.nan, math.inf, -1.0, "0", None, True])
def test_a_request_arrives_at_a_finite_time_at_or_after_0(arrival):
    with pytest.raises(KVLibError, match="request 0: arrival_s must be a finite number >= 0"):
        Request(0, arrival, (1, 2), 3)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ((), "non-empty tuple"),
        ("abc", "non-empty tuple"),  # a string's characters are no token ids
        (None, "non-empty tuple"),
        ((1.0, 2), "token ids must be integers >= 0"),
        ((True,), "token ids must be integers >= 0"),
        ((-1,), "token ids must be integers >= 0"),
    ],
)
def test_a_prompt_is_a_non_empty_tuple_of_token_ids(prompt, message):
    with pytest.raises(KVLibError, match=message):
        Request(0, 0.0, prompt, 3)


def test_valid_requests_still_work_with_numpy_integers():
    request = Request(0, 0.0, (np.int64(5), 7), 2)
    assert (request.prompt_len, request.total_len) == (2, 2 + 2)


@pytest.mark.parametrize("req_id", [-1, 1.5, True, "a"])
def test_a_request_id_is_an_integer_from_0(req_id):
    with pytest.raises(KVLibError, match="req_id must be an integer >= 0"):
        Request(req_id, 0.0, (1,), 1)


# ---------------------------------------------------------------- simulate's arguments


@pytest.mark.parametrize("block_size", [0, 1.5, True, -16, "16", None])
@pytest.mark.parametrize("policy", ["max", "paged"])
def test_block_size_must_be_a_positive_integer(policy, block_size):
    """0 raised ZeroDivisionError; 1.5 ran on with fractional blocks."""
    with pytest.raises(KVLibError, match="block_size must be an integer >= 1"):
        simulate(ONE, policy, 4096, STEP, block_size=block_size)


@pytest.mark.parametrize("num_slots", [0, 1.5, True, math.inf, math.nan, "4096", -1])
def test_num_slots_must_be_a_positive_integer(num_slots):
    with pytest.raises(KVLibError, match="num_slots must be an integer >= 1"):
        simulate(ONE, "paged", num_slots, STEP, max_len=8)


@pytest.mark.parametrize("max_len", [0, 1.5, True, math.inf, "2048"])
def test_max_len_must_be_a_positive_integer(max_len):
    with pytest.raises(KVLibError, match="max_len must be an integer >= 1"):
        simulate(ONE, "paged", 4096, STEP, max_len=max_len)


def test_a_budget_smaller_than_one_block_is_named():
    with pytest.raises(KVLibError, match="a budget of 8 slots holds no block of 16"):
        simulate(ONE, "paged", 8, STEP, max_len=8)


def test_numpy_integers_are_counts():
    """A right answer in numpy form runs exactly as the plain int does."""
    plain = simulate(ONE, "paged", 4096, STEP, block_size=16)
    numpy = simulate(ONE, "paged", np.int64(4096), STEP, block_size=np.int64(16))
    assert numpy.tokens_per_s == plain.tokens_per_s and numpy.num_slots == 4096


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_num_seqs=0), "max_num_seqs must be an integer >= 1, not 0"),
        (dict(max_num_seqs=2.5), "max_num_seqs must be an integer >= 1, not 2.5"),
        (dict(max_num_seqs=True), "max_num_seqs must be an integer >= 1, not True"),
        (dict(max_prefill_tokens=0), "max_prefill_tokens must be an integer >= 1, not 0"),
    ],
)
def test_scheduler_limits_are_named_instead_of_a_request_never_fits(kwargs, message):
    """max_num_seqs=0 used to run nothing and report "a request never fits"."""
    with pytest.raises(KVLibError, match=message):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(config={"max_num_seqs": 1}), "config must be a SchedulerConfig or None, not dict"),
        (dict(watermark="0.1"), "the watermark must be a finite number >= 0"),
        (dict(watermark=math.nan), "the watermark must be a finite number >= 0"),
        (dict(enable_prefix_caching="yes"), "enable_prefix_caching must be True or False"),
        (dict(allocator="lru"), "unknown allocator 'lru'"),
    ],
)
def test_options_are_checked(kwargs, message):
    with pytest.raises(KVLibError, match=message):
        simulate(ONE, "paged", 4096, STEP, **kwargs)


@pytest.mark.parametrize(
    "requests, message",
    [
        ([], "at least one request"),
        ([1], "requests must be Request objects, not int"),
        (5, "requests must be a list of Request, not int"),
        (
            [Request(3, 0.0, (1,), 2), Request(3, 0.0, (2,), 2)],
            "req_id 3 is used by more than one request",
        ),
    ],
)
def test_requests_are_checked(requests, message):
    """Two requests with one id shared one entry of the memory's tables: the second release failed."""
    with pytest.raises(KVLibError, match=message):
        simulate(requests, "max", 4096, STEP)


def test_the_step_model_is_checked():
    with pytest.raises(KVLibError, match="step_model must be a StepTimeModel, not NoneType"):
        simulate(ONE, "paged", 4096, None)
    with pytest.raises(KVLibError, match="fixed_s \\+ per_seq_s must be > 0"):
        simulate(ONE, "paged", 4096, StepTimeModel(0.0, 0.0, 1e-6, 1e-6))  # decode-free steps take 0 s


# ---------------------------------------------------------------- the step-time model


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "1", True, None])
@pytest.mark.parametrize("term", range(4))
def test_step_constants_are_finite_and_non_negative(term, bad):
    """A negative constant gave negative step times, and negative throughput."""
    constants = [0.01, 1e-4, 1e-6, 1e-5]
    constants[term] = bad
    with pytest.raises(KVLibError, match="StepTimeModel.* \\(seconds\\) must be a finite number >= 0"):
        StepTimeModel(*constants)


def test_fit_step_time_refuses_what_is_no_measurement():
    ok = [1, 2, 3, 4]
    with pytest.raises(KVLibError, match="needs numbers"):
        fit_step_time(["a"] * 4, ok, ok, ok)
    with pytest.raises(KVLibError, match="finite, non-negative counts and times"):
        fit_step_time([1, 2, 3, math.nan], ok, ok, ok)
    with pytest.raises(KVLibError, match="finite, non-negative counts and times"):
        fit_step_time([1, 2, 3, -4], ok, ok, ok)
    with pytest.raises(KVLibError, match="finite, non-negative counts and times"):
        fit_step_time(ok, ok, ok, [1, 2, 3, math.inf])


# ---------------------------------------------------------------- traces


@pytest.mark.parametrize("num", [True, 1.5, "3", None])
def test_make_trace_needs_a_whole_number_of_requests(num):
    """True used to reach numpy ("expected a sequence of integers")."""
    with pytest.raises(KVLibError, match="the number of requests must be an integer from 1 to"):
        make_trace(ALPACA, num, 1.0)


def test_make_trace_takes_a_numpy_number_of_requests():
    assert len(make_trace(ALPACA, np.int64(3), 1.0)) == 3


@pytest.mark.parametrize("rate", ["1", True, 0, -1, math.nan, None])
def test_make_trace_needs_a_positive_rate(rate):
    """A string rate used to raise TypeError from a comparison."""
    with pytest.raises(KVLibError, match="request rate .* must be a number > 0 \\(or inf\\)"):
        make_trace(ALPACA, 3, rate)


@pytest.mark.parametrize("seed", [-1, 1.5, "a", True, None])
def test_make_trace_needs_a_non_negative_integer_seed(seed):
    with pytest.raises(KVLibError, match="the seed must be an integer >= 0"):
        make_trace(ALPACA, 3, 1.0, seed=seed)
    with pytest.raises(KVLibError, match="the seed must be an integer >= 0"):
        sample_lengths(ALPACA, 3, seed=seed)


@pytest.mark.parametrize("vocab_size", [0, 1.5, True])
def test_make_trace_needs_a_vocabulary(vocab_size):
    with pytest.raises(KVLibError, match="vocab_size must be an integer >= 1"):
        make_trace(ALPACA, 3, 1.0, vocab_size=vocab_size)


@pytest.mark.parametrize("system_prompt", ["abc", (1.5,), (-1,), None])
def test_a_system_prompt_is_token_ids(system_prompt):
    """A string was split into characters and silently used as tokens."""
    with pytest.raises(KVLibError, match="system_prompt must be a tuple of token ids"):
        make_trace(ALPACA, 3, 1.0, system_prompt=system_prompt)


@pytest.mark.parametrize(
    "args, message",
    [
        (("t", "1", 4), "trace 't': mean_input must be a finite number >= 0"),
        (("t", 4, math.nan), "trace 't': mean_output must be a finite number >= 0"),
        (("t", 4, 4, math.inf), "trace 't': sigma must be a finite number >= 0"),
        (("t", 4, 4, 1.0, 64.5), "trace 't': max_len must be an integer >= 2"),
        (("t", 4, 4, 1.0, True), "trace 't': max_len must be an integer >= 2"),
    ],
)
def test_trace_specs_are_checked(args, message):
    with pytest.raises(KVLibError, match=message):
        TraceSpec(*args)


@pytest.mark.parametrize("factor", [0, -2, "2", math.nan, math.inf])
def test_scaling_a_trace_needs_a_positive_factor(factor):
    """0 raised ZeroDivisionError."""
    with pytest.raises(KVLibError, match="the scaling factor must be a finite number > 0"):
        ALPACA.scaled(factor)


# ---------------------------------------------------------------- the memories themselves


def test_memories_check_their_counts():
    with pytest.raises(KVLibError, match="num_blocks must be an integer >= 1, not 2.5"):
        BlockCounter(2.5, 16)
    with pytest.raises(KVLibError, match="num_slots must be an integer >= 1, not 1.5"):
        ReservedMemory("max", 1.5, 8)
    with pytest.raises(KVLibError, match="the watermark must be a finite number >= 0, not '0'"):
        PagedMemory(BlockCounter(8, 16), 16, watermark="0")
    with pytest.raises(KVLibError, match="block_size must be an integer >= 1, not 0"):
        make_memory("paged", 4096, 64, block_size=0)


# ---------------------------------------------------------------- the GPU model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(block_size=0), "block_size must be an integer >= 1, not 0"),  # was ZeroDivisionError
        (dict(block_size=1.5), "block_size must be an integer >= 1, not 1.5"),  # gave 32015.0 blocks
        (dict(gpu_bytes=math.nan), "gpu_bytes must be an integer >= 1, not nan"),
        (dict(gpu_bytes="24"), "gpu_bytes must be an integer >= 1, not '24'"),
        (dict(gpu_bytes=True), "gpu_bytes must be an integer >= 1, not True"),
        (dict(memory_fraction=2), "memory_fraction is a share of the GPU in \\(0, 1\\], not 2"),
        (dict(memory_fraction=math.nan), "memory_fraction must be a finite number >= 0, not nan"),
    ],
)
def test_kv_budget_names_its_bad_arguments(kwargs, message):
    from kvlib.serving.roofline import kv_budget

    with pytest.raises(KVLibError, match=message):
        kv_budget("Llama-2-7B", **kwargs)


def test_roofline_step_refuses_a_bool_count():
    from kvlib.serving.roofline import roofline_step

    with pytest.raises(KVLibError, match="bytes_per_token must be an integer >= 1, not True"):
        roofline_step(10**9, True)
