"""Exercises of chapter 9 (MLA in depth: decoding with the weights absorbed): DeepSeek-V3's latent bytes
per token, the arithmetic intensity of absorbed decode against the A100's ridge, and the cache per
GPU under tensor parallelism and under data-parallel attention.

Each ``check_9_k`` computes the expected answer with kvlib (:mod:`kvlib.sizing` for 9.1 and 9.3,
:mod:`kvlib.chapters.ch09_mla_absorbed.decode_model` for 9.2), never typed in, and recognises the usual
mistakes by the answers they produce.
"""

from __future__ import annotations

import math

from kvlib.chapters.ch09_mla_absorbed.decode_model import decode_forms, deepseek_v3_shape, gpu_ridge
from kvlib.exercises.feedback import as_number, numeric_answer
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.parallel import per_gpu_bytes
from kvlib.sizing.spec import bytes_per_token

# ---- 9.1 DeepSeek-V3's cache bytes per token


def solve_9_1() -> int:
    """(latent 512 + rotary key 64) values x 2 bytes (fp16) x 61 layers."""
    return (512 + 64) * 2 * 61


def check_9_1(answer):
    """Exercise 9.1: fp16 bytes one token adds to DeepSeek-V3's MLA cache over all layers."""
    expected = bytes_per_token(catalog_entry("DeepSeek-V3").spec)
    return numeric_answer(
        answer,
        expected,
        {
            expected / 61: "that is one layer; the cache has a latent in each of the 61 layers",
            512 * 2 * 61: "the decoupled rotary key (64 values) is cached beside the latent",
            2 * expected: "MLA caches one latent per token, not a K and a V: no factor 2 for K and V",
            128 * (192 + 128) * 2 * 61: "that is the expanded form's per-head K and V; MLA caches the latent",
            expected * 8: "that is bits; answer in bytes",
        },
    )


# ---- 9.2 arithmetic intensity of absorbed decode


def solve_9_2() -> tuple[float, bool]:
    """128 heads x 2 x (576 for the scores + 512 for the weighted sum) FLOPs over 576 x 2 bytes;
    the A100's ridge is 312e12 / 1.555e12 FLOPs per byte."""
    intensity = 128 * 2 * (576 + 512) / (576 * 2)
    return intensity, intensity > 312e12 / 1.555e12


def check_9_2(answer):
    """Exercise 9.2: (FLOPs per byte of the absorbed decode, above the A100's ridge?)."""
    if not isinstance(answer, tuple | list) or len(answer) != 2:
        return "answer with a tuple (flops_per_byte, above_ridge): a number and True or False"
    intensity, above = answer
    expected = decode_forms(deepseek_v3_shape())[0].intensity
    hint = numeric_answer(
        intensity,
        expected,
        {
            128 * 2 * 576 / 1152: "you counted the scores only; the weighted sum of the latents costs too",
            expected / 128: "that is one head; all 128 heads read the same latent, so their FLOPs add up",
            expected / 2: "a multiply-add is 2 FLOPs",
            1.0: "that is the expanded form (per-head K/V read once each)",
        },
        what="FLOPs (all heads, scores and sum) over the bytes of one latent",
    )
    if hint:
        return hint
    if not isinstance(above, bool):
        return "say above_ridge with True or False"
    if above != (expected > gpu_ridge()):
        return "compare with the ridge: peak FLOP/s over bandwidth in bytes/s, about 200 FLOPs per byte"
    return None


# ---- 9.3 TP against data-parallel attention

CONTEXT, BATCH, NUM_GPUS = 4096, 64, 8  # the deployment of exercise 9.3


def solve_9_3() -> tuple[int, int]:
    """TP replicates the latent: every GPU holds the whole batch's cache. DP attention gives each GPU
    64 / 8 = 8 sequences."""
    per_seq = 4096 * (512 + 64) * 2 * 61
    return 64 * per_seq, 64 // 8 * per_seq


def check_9_3(answer):
    """Exercise 9.3: (bytes per GPU under TP 8, bytes per GPU under DP attention 8) for DeepSeek-V3."""
    if not isinstance(answer, tuple | list) or len(answer) != 2:
        return "answer with a tuple (tp_bytes, dp_bytes): two numbers of bytes"
    spec = catalog_entry("DeepSeek-V3").spec
    tp = per_gpu_bytes(spec, CONTEXT, BATCH, tensor_parallel_size=NUM_GPUS)
    dp = per_gpu_bytes(spec, CONTEXT, BATCH // NUM_GPUS)
    numbers = [as_number(a) for a in answer]
    if None in numbers:
        return "answer with two numbers of bytes"
    if abs(numbers[0] - tp / NUM_GPUS) <= 2e-3 * tp / NUM_GPUS:
        return "TP splits heads, but the latent is shared by all heads: every TP rank holds all of it"
    return numeric_answer(numbers[0], tp, {tp / 61: "count all 61 layers"}, what="the TP bytes") or (
        numeric_answer(
            numbers[1], dp, {tp: "DP attention splits the batch: each GPU holds its own sequences only"}
        )
    )


# ---- 9.4 heads the absorbed form needs to reach the ridge


def solve_9_4() -> int:
    """Intensity heads x 2 x (576 + 512) / (576 x 2) = heads x 1088 / 576 must reach the ridge
    312e12 / 1.555e12: the smallest whole number of heads that does."""
    ridge = 312e12 / 1.555e12
    return math.ceil(ridge * 576 / 1088)


def check_9_4(answer):
    """Exercise 9.4: the fewest heads that make DeepSeek-V3's latent, absorbed, compute-bound on an A100."""
    number = as_number(answer)
    if number is not None and (abs(number) > 1e300 or math.isnan(number)):
        return numeric_answer(number, 1, {})  # the general hint for an unusable number
    if number is None or number != int(number):
        return "answer with a whole number of heads"
    shape = deepseek_v3_shape()
    per_head = decode_forms(shape)[0].intensity / shape.num_heads  # FLOPs per byte one head adds
    expected = math.ceil(gpu_ridge() / per_head)
    scores_only = math.ceil(gpu_ridge())  # 2 x 576 FLOPs per head over 1,152 bytes: 1 per head
    return numeric_answer(
        number,
        expected,
        {
            expected - 1: "that many heads fall just short of the ridge: round up",
            scores_only: "you counted the scores only; the weighted sum of the latents costs too",
            math.ceil(2 * gpu_ridge() / per_head): "a multiply-add is 2 FLOPs",
        },
        rel=0,
        what="heads x FLOPs per head over the latent's bytes, against the ridge",
    )


WRONG_ANSWERS = {
    "9.1": [1152, 62_464, 140_544, 4_997_120, 562_176, "70272"],
    "9.2": [(128.0, True), (241.78 / 128, False), (120.89, False), (1.0, False), (241.78, False), 241.78],
    "9.4": [106, 201, 213, 106.2, "107"],
    "9.3": [(2_302_697_472, 2_302_697_472), (18_421_579_776, 18_421_579_776), (301_989_888, 37_748_736), 1],
}

FIRST_HINTS = {
    "9.1": (
        "an MLA layer caches one latent vector and one rotary key per token, shared by every head: add their "
        "values, then count bytes and layers"
    ),
    "9.2": (
        "every head scores the same cached latent and rope key and sums the same latent: count the FLOPs of "
        "all heads for one cached token, then divide by that token's bytes"
    ),
    "9.3": (
        "tensor parallelism splits an attention layer by heads; ask whether the latent can be split that "
        "way, and what data-parallel attention splits instead"
    ),
    "9.4": (
        "the absorbed form's intensity is the number of heads times what one head adds per byte: find "
        "that, then the heads at which the product reaches the ridge"
    ),
}

EXERCISES = {
    "9.1": (check_9_1, solve_9_1),
    "9.2": (check_9_2, solve_9_2),
    "9.3": (check_9_3, solve_9_3),
    "9.4": (check_9_4, solve_9_4),
}
