"""Deployment: the nine numbers of one model on its GPUs, checked once when made, frozen after;
capacity_report takes one, calculator_report checks the forms' bounds before making one."""

import dataclasses
import re

import pytest

from kvlib import KVLibError
from kvlib.sizing import widget
from kvlib.sizing.deployment import Deployment
from kvlib.units import GiB


def test_defaults_and_derived_bytes():
    d = Deployment("Llama-3-8B", 8192)
    assert (d.batch, d.kv_dtype, d.gpu_gib, d.weight_dtype, d.overhead_gib) == (1, "fp16", 80.0, "bf16", 4.0)
    assert (d.gpu_bytes, d.overhead_bytes, d.num_gpus) == (80 * GiB, 4 * GiB, 1)
    assert Deployment("Llama-3-8B", 8192, tensor_parallel_size=2, pipeline_parallel_size=4).num_gpus == 8
    assert d.entry.name == "Llama-3-8B" and Deployment("llama-3-8b", 8192).entry.name == "Llama-3-8B"


def test_frozen_and_hashable():
    d = Deployment("Llama-3-8B", 8192)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.context = 4096  # type: ignore[misc]
    assert d == Deployment("Llama-3-8B", 8192) and len({d, Deployment("Llama-3-8B", 8192)}) == 1
    assert dataclasses.replace(d, batch=4).batch == 4


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(model="Llama-3-8B", context=0), "context must be an integer >= 1, not 0"),
        (dict(model="Llama-3-8B", context=9000), "exceeds Llama-3-8B's maximum"),
        (dict(model="Llama-3-8B", context=10, batch=0), "batch must be an integer >= 1, not 0"),
        (dict(model="Llama-3-8B", context=10, batch=2.5), "batch must be an integer"),
        (dict(model="Llama-3-8B", context=10, kv_dtype="fp12"), "unknown KV dtype 'fp12'"),
        (dict(model="Llama-3-8B", context=10, weight_dtype="fp12"), "unknown KV dtype 'fp12'"),
        (dict(model="Llama3-8B", context=10), "unknown model"),
        (dict(model=8, context=10), "model must be a catalog name, not 8"),
        (dict(model="Llama-3-8B", context=10, gpu_gib=0), "GPU memory must be positive"),
        (dict(model="Llama-3-8B", context=10, overhead_gib=-1), "overhead non-negative, not 80.0 and -1"),
        (
            dict(model="Llama-3-8B", context=10, tensor_parallel_size=0),
            "tensor_parallel_size must be an integer >= 1",
        ),
        (dict(model="Llama-3-8B", context=10, pipeline_parallel_size=33), "exceeds the 32 layers"),
    ],
)
def test_each_field_is_checked_when_made(kw, message):
    with pytest.raises(KVLibError, match=re.escape(message)) as error:
        Deployment(**kw)
    assert "\n" not in str(error.value)


def test_capacity_report_takes_a_deployment():
    with pytest.raises(KVLibError, match="deployment must be a kvlib.sizing.deployment.Deployment"):
        widget.capacity_report("Llama-3-8B")
    r = widget.capacity_report(Deployment("Llama-3-8B", 8192, 8))
    assert r["model"] == "Llama-3-8B" and r["batch"] == 8 and r["max_batch"] == 61


def test_calculator_report_checks_the_forms_bounds_first():
    # 200,000 GiB is a Deployment kvlib can size (below MAX_GIB) but beyond the forms' bound
    Deployment("Llama-3-8B", 10, gpu_gib=200_000)
    with pytest.raises(KVLibError, match="GPU memory must be at most 100,000 GiB here"):
        widget.calculator_report(model="Llama-3-8B", context=10, gpu_gib=200_000)
    # the bound comes before the model is looked up, as in the online script
    with pytest.raises(KVLibError, match="tensor_parallel_size must be at most 1,024 here"):
        widget.calculator_report(model="nonsense", context=10, tensor_parallel_size=2048)
    with pytest.raises(KVLibError, match="batch must be at most 100,000 here"):
        widget.calculator_report(model="Llama-3-8B", context=10, batch=100_001)
    report = widget.calculator_report(model="Llama-3-8B", context=8192, batch=8)
    assert report == widget.capacity_report(Deployment("Llama-3-8B", 8192, 8))
