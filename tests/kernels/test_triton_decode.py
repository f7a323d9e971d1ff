"""The Triton decode kernel equals the PyTorch reference on a GPU (tolerance: tests/kernels/cases.py);
on machines without Triton or CUDA these tests skip, saying why."""

import pytest
import torch

from kvlib.kernels.dispatch import decode_attention
from kvlib.kernels.triton_decode import triton_available
from tests.kernels.cases import RTOL, decode_case, reference, relative_error

pytestmark = pytest.mark.skipif(
    not triton_available(), reason="the Triton kernel needs Triton and a CUDA device (CPU-only machine)"
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("group", [1, 4, 8, 32])
@pytest.mark.parametrize("block_size", [1, 16, 128])
def test_triton_equals_the_reference(block_size, group, dtype):
    inputs = decode_case([1, 17, 130, 300], block_size, num_kv_heads=2, group=group, dtype=dtype)
    ref = reference(*inputs)
    cuda = [t.cuda() for t in inputs]
    for num_splits in (1, 3, None):
        out = decode_attention(*cuda, kernel="triton", num_splits=num_splits)
        assert relative_error(out.cpu(), ref) < RTOL, num_splits


def test_triton_is_the_default_on_cuda():
    from kvlib.kernels.dispatch import default_kernel

    assert default_kernel("cuda") == "triton"
