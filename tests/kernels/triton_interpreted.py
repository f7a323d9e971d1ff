"""The Triton decode kernel run in Triton's interpreter on CPU tensors (``make triton-interpreted``).

``python -m tests.kernels.triton_interpreted`` sets ``TRITON_INTERPRET=1`` before Triton decorates
the kernel, then checks it as tests/kernels/test_triton_decode.py does on a GPU: equal to the
PyTorch reference (tolerance: tests/kernels/cases.py) for block sizes 1, 16 and 128, group sizes
1, 4, 8 and 32, every cache dtype, one split, three and the default, and random shapes; and the
paged model generates the contiguous cache's tokens with it. The interpreter runs the kernel's
own code (its indexing, masks, online softmax and split merge) with numpy, so it checks the
kernel's logic, not its speed or the GPU's float rounding. Exits 1 with the first failure.
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before kvlib imports Triton

import torch  # noqa: E402

from kvlib.kernels.dispatch import decode_attention  # noqa: E402
from kvlib.kernels.triton_decode import triton_runs_on  # noqa: E402
from tests.kernels.cases import RTOL, decode_case, reference, relative_error  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_case(inputs, label: str, splits=(1, 3, None)) -> None:
    ref = reference(*inputs)
    for num_splits in splits:
        out = decode_attention(*inputs, kernel="triton", num_splits=num_splits)
        error = relative_error(out, ref)
        if not error < RTOL:
            sys.exit(f"{label}, num_splits={num_splits}: error {error:.2e} >= {RTOL}")


def random_cases(num_cases: int, seed: int = 0) -> None:
    """Random lengths (from 1, mixed in a batch), block sizes, groups, head_dims and dtypes."""
    gen = torch.Generator().manual_seed(seed)
    for case in range(num_cases):
        pick = lambda options: options[int(torch.randint(len(options), (1,), generator=gen))]  # noqa: E731
        lengths = torch.randint(1, 200, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen)
        block_size, group, head_dim = pick((1, 5, 16, 128)), pick((1, 2, 4, 8, 32)), pick((8, 16, 24, 64))
        dtype = pick(DTYPES)
        inputs = decode_case(lengths.tolist(), block_size, 2, group, head_dim, dtype, seed=case)
        check_case(
            inputs, f"random case {case} ({lengths.tolist()}, {block_size}, {group}, {head_dim}, {dtype})"
        )


def paged_model_tokens() -> None:
    """The paged model's tokens with the Triton kernel equal the contiguous cache's (MHA, GQA, MQA)."""
    from kvlib.cache.generation import generate
    from kvlib.model.config import ModelConfig
    from kvlib.model.llama import TinyLlama
    from kvlib.paged.decode_loop import generate_paged
    from kvlib.paged.paged_cache import PagedKVCache

    PagedKVCache.decode_kernel = "triton"
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (5, 17, 1, 40)]
    for num_kv_heads in (4, 2, 1):
        config = ModelConfig(97, 64, 2, 4, num_kv_heads, 96, max_seq_len=256)
        model = TinyLlama(config)
        run = generate_paged(model, prompts, 8, block_size=16)
        expected = [generate(model, torch.tensor([p]), 8, "cache").tokens[0].tolist() for p in prompts]
        if run.tokens != expected:
            sys.exit(
                f"{num_kv_heads} KV heads: the Triton kernel's tokens differ from the contiguous cache's"
            )


def main() -> None:
    if not triton_runs_on(torch.device("cpu")):
        sys.exit("Triton is not importable here: make triton-interpreted installs it into .triton-cpu/")
    for dtype in DTYPES:
        for group in (1, 4, 8, 32):
            for block_size in (1, 16, 128):
                inputs = decode_case([1, 17, 130, 300], block_size, num_kv_heads=2, group=group, dtype=dtype)
                check_case(inputs, f"block {block_size}, group {group}, {dtype}")
    random_cases(12)
    paged_model_tokens()
    print("the Triton kernel, interpreted, equals the reference and generates the same tokens")


if __name__ == "__main__":
    main()
