"""Edges of the engine and traces: a prompt id outside the model's vocabulary, float budgets, a trace too
large to step through; each refused at the entry point with a KVLibError stating the limit."""

import pytest

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.serving.engine import run_engine
from kvlib.serving.traces import MAX_REQUESTS, Request, TraceSpec, make_trace

CONFIG = ModelConfig(
    vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=16, max_seq_len=64
)


@pytest.fixture(scope="module")
def model():
    return TinyLlama(CONFIG).eval()


def test_the_engine_refuses_a_prompt_outside_the_vocabulary(model):
    requests = [Request(0, 0.0, (1, 2, 99), 2)]
    with pytest.raises(KVLibError, match="token id 99; the model's vocabulary is 0..15"):
        run_engine(model, requests, "paged", 64, 32, block_size=4, progress=False)


@pytest.mark.parametrize(("name", "value"), [("num_slots", 64.0), ("max_len", 1.5), ("block_size", 0)])
def test_the_engine_names_a_count_that_is_not_one(model, name, value):
    arguments = {"num_slots": 64, "max_len": 32, "block_size": 4, name: value}
    with pytest.raises(KVLibError, match=f"{name} must be an integer >= 1"):
        run_engine(model, [Request(0, 0.0, (1, 2), 2)], "paged", progress=False, **arguments)


def test_the_engine_refuses_what_is_not_a_model():
    with pytest.raises(KVLibError, match="kvlib TinyLlama"):
        run_engine(object(), [Request(0, 0.0, (1, 2), 2)], "paged", 64, 32, progress=False)


def test_a_trace_beyond_the_limit_is_refused_before_sampling():
    spec = TraceSpec("t", 10.0, 10.0, max_len=64)
    with pytest.raises(KVLibError, match=f"from 1 to {MAX_REQUESTS:,}"):
        make_trace(spec, MAX_REQUESTS + 1, 1.0)
