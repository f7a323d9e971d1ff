"""Exercises of chapter 7 (What a smaller cache costs): the bytes of an int4 cache with its scales,
KIVI's residual, mean-pooled K/V heads, what StreamingLLM keeps of the register, and a
quantizer written by the reader.

Each ``check_7_k`` computes the expected answer with kvlib (:mod:`kvlib.quant`,
:mod:`kvlib.model.head_pooling`, :mod:`kvlib.cache.eviction_policies`), never typed in, and recognises
the usual mistakes by the answers they produce.
"""

from __future__ import annotations

import torch

from kvlib.cache.eviction_policies import eviction_policy
from kvlib.chapters.ch07_quality.tradeoffs import QUARTER_BUDGET
from kvlib.exercises.feedback import (  # a number checked against the mistakes it is known for
    as_float_tensor,
    as_items,
    as_number,
    numeric_answer,
)
from kvlib.model.head_pooling import pooled_rows
from kvlib.quant.formats import kv_quant_format
from kvlib.quant.minmax import quantize_minmax
from kvlib.train.corpus import CorpusConfig
from kvlib.train.trainer import QUALITY_MODEL

HEADS_AND_LAYERS = QUALITY_MODEL.num_layers * QUALITY_MODEL.num_kv_heads  # 4 x 8: K (and V) vectors a token
KIVI_TOKENS = 500  # the context of exercise 7.2: 3 groups of 128 quantized, 116 in the residual


# ---- 7.1 an int4 cache, scales included


def solve_7_1() -> int:
    """Per vector: 16 values x 4 bits = 8 bytes, 2 groups x (fp16 scale + fp16 zero) = 8 bytes."""
    vector = 16 * 4 // 8 + (16 // 8) * (2 + 2)
    return 2 * 4 * 8 * vector  # K and V, 4 layers, 8 KV heads


def check_7_1(answer):
    """Exercise 7.1: KV bytes per token of the chapter's model in int4, groups of 8 values.

    None if right, else a hint that names the likely mistake.
    """
    fmt = kv_quant_format("int4", group_size=8)
    expected = HEADS_AND_LAYERS * fmt.quantized_bytes_per_token(QUALITY_MODEL.head_dim)
    codes = 2 * HEADS_AND_LAYERS * QUALITY_MODEL.head_dim * 4 / 8
    return numeric_answer(
        answer,
        expected,
        {
            codes: (
                "half the answer: either the 4-bit codes alone (each group of 8 values also stores an fp16 "
                "scale and an fp16 zero point, 4 bytes, as much as its codes here) or the keys alone (a "
                "token stores a key AND a value per KV head and layer)"
            ),
            codes + codes / 2: (
                "2 bytes of metadata per 8 values: a group of 16 (the other int4 setting), or a scale "
                "without its zero point; here each group of 8 stores both, 4 bytes"
            ),
            codes * 3: "the scale and zero point are fp16, 2 bytes each, not fp32",
            2.0
            * HEADS_AND_LAYERS
            * QUALITY_MODEL.head_dim
            * 2: "that is the full fp16 cache: 2 bytes per value",
            expected * 8: "that is in bits; answer in bytes",
            expected / QUALITY_MODEL.num_layers: "that is one layer; the model has 4",
            expected / QUALITY_MODEL.num_kv_heads: "that is one KV head; each layer has 8",
            expected / HEADS_AND_LAYERS: "that is one KV head of one layer; multiply by 4 layers x 8 heads",
        },
        rel=1e-9,
        what="2 (K, V) x 4 layers x 8 heads x (8 bytes of codes + 2 groups x 4 bytes)",
    )


# ---- 7.2 KIVI's residual


def solve_7_2() -> float:
    """384 tokens quantized at 12.5 bytes per head and layer, 116 in fp16 at 64, over 500 tokens, x 32."""
    keys = 16 * (128 * 2 // 8 + 4) / 128  # a channel's 128 tokens: 32 bytes of codes + scale and zero
    values = 16 * 2 // 8 + 4  # one token's 16 values: 4 bytes of codes + scale and zero
    quantized, residual = 384, 500 - 384
    per_head = quantized * (keys + values) + residual * 2 * 16 * 2
    return 32 * per_head / 500


def _kivi_bytes(quantized_per_token: float, num_residual: int, residual_bytes: float = 64.0) -> float:
    """Bytes per token of KIVI_TOKENS, ``num_residual`` of them at ``residual_bytes`` per head and layer."""
    per_head = (KIVI_TOKENS - num_residual) * quantized_per_token + num_residual * residual_bytes
    return HEADS_AND_LAYERS * per_head / KIVI_TOKENS


def check_7_2(answer):
    """Exercise 7.2: KIVI-2's KV bytes per token at 500 tokens, with the residual of 128 tokens.

    None if right, else a hint that names the likely mistake.
    """
    fmt = kv_quant_format("kivi2", group_size=16, residual_length=128)
    expected = HEADS_AND_LAYERS * fmt.context_bytes(KIVI_TOKENS, QUALITY_MODEL.head_dim) / KIVI_TOKENS
    quantized = fmt.quantized_bytes_per_token(QUALITY_MODEL.head_dim)  # 12.5 bytes per head and layer
    residual = fmt.num_residual(KIVI_TOKENS)  # 116
    return numeric_answer(
        answer,
        expected,
        {
            HEADS_AND_LAYERS * quantized: (
                "that is every token quantized; the last 500 mod 128 = 116 tokens are still in fp16 "
                "until 128 of them have gathered"
            ),
            _kivi_bytes(quantized, 128): (
                "the residual holds 500 mod 128 = 116 tokens here, not 128: at 128 they are quantized"
            ),
            _kivi_bytes(quantized, residual, 32.0): "the residual keeps each token's key AND value in fp16",
            _kivi_bytes(16.0, residual): (
                "KIVI quantizes keys per channel: one scale and zero point per channel and 128 tokens, "
                "not per token"
            ),
            _kivi_bytes(quantized - 0.5, residual): (
                "each key channel also stores an fp16 scale and zero point per group of 128 tokens"
            ),
            _kivi_bytes(8.0, residual): "count the scales and zero points of keys and values too",
            expected * KIVI_TOKENS: "that is the whole context; divide by its 500 tokens",
            expected / HEADS_AND_LAYERS: "that is one KV head of one layer; multiply by 4 layers x 8 heads",
        },
        rel=1e-4,
        what="(384 x 12.5 + 116 x 64) x 32 / 500",
    )


# ---- 7.3 mean-pooling two heads into one

# k_proj.weight of a toy layer: 4 K heads of head_dim 2 (two rows each), d_model 3
K_PROJ = (
    (2, 0, -1),
    (1, 3, 0),  # head 0
    (4, 2, 1),
    (-1, 1, 2),  # head 1
    (0, -2, 3),
    (3, 1, 1),  # head 2
    (2, 4, -1),
    (1, -1, 3),  # head 3
)


def solve_7_3() -> torch.Tensor:
    """New head j is the mean of old heads 2j and 2j + 1, row by row: (4, 3)."""
    heads = torch.tensor(K_PROJ, dtype=torch.float64).reshape(4, 2, 3)  # (old head, row, d_model)
    return heads.reshape(2, 2, 2, 3).mean(dim=1).reshape(4, 3)  # (new head x row, d_model)


def _k_proj() -> torch.Tensor:
    return torch.tensor(K_PROJ, dtype=torch.float64)  # (8, 3)


def check_7_3(answer):
    """Exercise 7.3: the toy k_proj mean-pooled from 4 K/V heads to 2 (kvlib.model.head_pooling).

    None if right, else a hint that names the likely mistake.
    """
    got = as_float_tensor(answer)
    if got is None:
        return f"answer with a (4, 3) tensor or nested list of numbers, not {type(answer).__name__}"
    expected = pooled_rows(_k_proj(), 2, 2, "mean")
    if got.shape == (2, 3):
        return "2 heads of head_dim 2 keep 2 rows each: the answer has 4 rows (pool heads, not rows)"
    if got.shape == (3, 4):
        return "k_proj.weight is (heads x head_dim, d_model) = (4, 3) after pooling: you transposed it"
    if got.shape != expected.shape:
        return f"2 heads x 2 rows by d_model 3 columns: the shape is (4, 3), not {tuple(got.shape)}"
    if torch.allclose(got, expected):
        return None
    heads = _k_proj().reshape(4, 2, 3)  # (old head, row, d_model)
    mistakes = {
        "keep": (pooled_rows(_k_proj(), 2, 2, "keep"), "that keeps the first head of each group; mean-pool"),
        "sum": (2 * expected, "that is the sum of the two heads; take their mean"),
        "strided": (
            heads.reshape(2, 2, 2, 3).mean(dim=0).reshape(4, 3),
            "groups are consecutive heads (0 and 1, then 2 and 3), as query head i reads K/V head i // 2",
        ),
        "rows": (
            heads.mean(dim=1),
            "you averaged the two rows of each head; average the same row across the two heads of a group",
        ),
    }
    for value, hint in mistakes.values():
        if torch.allclose(got, value):
            return hint
    return "not quite: new head j's row r is the mean of row r of heads 2j and 2j + 1"


# ---- 7.4 what StreamingLLM keeps of the register


def solve_7_4() -> list[int]:
    """The 4 sinks are positions 0 to 3: <bos> and the first fact; the 124 recent ones are far later."""
    return [1, 2, 3]


def check_7_4(answer):
    """Exercise 7.4: the register positions StreamingLLM (4 sinks, budget 128) keeps at the first probe.

    None if right, else a hint that names the likely mistake.
    """
    config = CorpusConfig()
    register = range(1, 1 + 3 * config.num_facts)  # positions 1 .. 24: KEY VALUE ; eight times
    kept = eviction_policy("sinks", QUARTER_BUDGET).kept_positions(range(config.probe_from))
    expected = [p for p in kept if p in register]
    positions = as_items(answer)
    if positions is None:
        return f"answer with a list of positions, such as [5, 6], not {type(answer).__name__}"
    numbers = [as_number(p) for p in positions]
    if any(not isinstance(n, int) for n in numbers):
        return "answer with a list of whole positions, such as [5, 6]"
    got = sorted(numbers)
    if got == expected:
        return None
    hints = {
        (): "StreamingLLM keeps the first 4 tokens forever, whatever the budget: which of them are register?",
        (0, 1, 2, 3): "position 0 is <bos>, not part of the register (positions 1 to 24)",
        (1, 2, 3, 4): "the 4 sinks are positions 0 to 3, <bos> included",
        tuple(register): "the budget keeps 128 of 384 tokens: 4 sinks and the 124 most recent",
        tuple(kept): "that is every position kept; the question asks which of them are register positions",
    }
    return hints.get(tuple(got), "not quite: which of positions 1 to 24 are among the 128 the policy keeps?")


# ---- 7.5 a quantizer of your own


def solve_7_5():
    """Per group: zero point = min, scale = (max - min) / (2^bits - 1); codes rounded; read back."""

    def quantize_dequantize(x: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
        groups = x.reshape(*x.shape[:-1], -1, group_size)  # (..., num_groups, group_size)
        low = groups.amin(dim=-1, keepdim=True)
        scale = (groups.amax(dim=-1, keepdim=True) - low) / (2**bits - 1)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # equal values: codes 0
        codes = ((groups - low) / safe).round().clamp(0, 2**bits - 1)
        return (codes * scale + low).reshape(x.shape)

    return quantize_dequantize


def check_7_5(answer):
    """Exercise 7.5: a reader's quantize_dequantize(x, bits, group_size), against kvlib.quant.minmax.

    None if right, else a hint that names the likely mistake.
    """
    if not callable(answer):
        return "answer with a function quantize_dequantize(x, bits, group_size) -> the read-back tensor"
    for bits, group_size, shape in QUANTIZER_CASES:
        x = _quantizer_input(shape, group_size)
        try:
            got = answer(x.clone(), bits, group_size)
        except Exception as error:  # the reader's code: report, do not crash
            return f"your function raised {type(error).__name__}: {error}"[:160]
        hint = _read_back_hint(x, got, bits, group_size)
        if hint:
            return f"bits={bits}, group_size={group_size}: {hint}"
    return None


QUANTIZER_CASES = ((2, 8, (4, 32)), (4, 32, (3, 64)), (2, 16, (2, 3, 32)), (8, 16, (4, 32)))  # bits, group, x


def _quantizer_input(shape: tuple[int, ...], group_size: int) -> torch.Tensor:
    """Seeded float32 values, each group with its own offset (mostly positive), the first group constant."""
    gen = torch.Generator().manual_seed(sum(shape) * group_size)
    offsets = 2 + 4 * torch.randn(*shape[:-1], shape[-1] // group_size, 1, generator=gen)  # one per group
    x = (torch.randn(*shape[:-1], shape[-1] // group_size, group_size, generator=gen) + offsets).reshape(
        shape
    )
    x.view(-1, shape[-1])[0, :group_size] = 1.25  # a group of equal values: its scale is 0
    return x


def _read_back_hint(x: torch.Tensor, got, bits: int, group_size: int) -> str | None:
    """None if ``got`` is ``x`` quantized in ``bits`` and read back within half a step; else a hint."""
    y = as_float_tensor(got)
    if y is None:
        return f"your function returned {type(got).__name__}, not a tensor of read-back values"
    if y.shape != x.shape:
        return f"x of shape {tuple(x.shape)} came back as shape {tuple(y.shape)}: return one value per value"
    groups, y_groups = x.double().reshape(-1, group_size), y.reshape(-1, group_size)  # (groups, group_size)
    if not bool(y.isfinite().all()):
        if not bool(y_groups[0].isfinite().all()):
            return (
                "a group of equal values came back as NaN: its scale is 0, so store codes 0 and read back min"
            )
        return "your function returned NaN or inf"
    if torch.equal(y, x.double()):
        return "x came back unchanged: quantize it (codes), then read the codes back"
    levels = 2**bits
    if bool((y == y.round()).all() & (y >= 0).all() & (y < levels).all()):
        return "those are the codes; return them read back: code x scale + zero point"
    step = (groups.amax(dim=1, keepdim=True) - groups.amin(dim=1, keepdim=True)) / (levels - 1)
    error = (y_groups - groups).abs()
    over = error > step / 2 * (1 + 1e-3) + 1e-6 * (1 + groups.abs())
    distinct = max(len(torch.unique(g)) for g in y_groups)
    if not bool(over.any()) and distinct <= levels:
        return None
    for mistake, hint in KNOWN_QUANTIZER_MISTAKES:
        if torch.allclose(y, mistake(x, bits, group_size).double(), atol=1e-5):
            return hint
    if distinct > levels:
        return f"a group came back with {distinct} different values; {bits} bits give at most {levels}"
    worst = int((error - step / 2).flatten().argmax())
    reference = quantize_minmax(x, bits, group_size).dequantize().double().flatten()[worst]
    return (
        f"{groups.flatten()[worst]:.4f} came back as {y.flatten()[worst]:.4f}, off by more than half a "
        f"step ({float(step.expand_as(error).flatten()[worst]) / 2:.3g}); kvlib.quant.minmax reads it "
        f"back as {reference:.4f}"
    )


# ---- realistic mistakes, which tests/test_exercises.py feeds to the checks


def _symmetric(x, bits, group_size):
    """Symmetric: scale = max |x| / (2^(bits-1) - 1), signed codes, no zero point."""
    groups = x.reshape(*x.shape[:-1], -1, group_size)
    top = 2 ** (bits - 1) - 1
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / top
    return ((groups / scale).round().clamp(-top - 1, top) * scale).reshape(x.shape)


def _per_tensor(x, bits, group_size):
    """One scale and zero point for the whole tensor, not per group."""
    low, scale = x.min(), (x.max() - x.min()) / (2**bits - 1)
    return ((x - low) / scale).round() * scale + low


def _no_zero_guard(x, bits, group_size):
    """Divides by the scale even when a group's values are all equal (scale 0)."""
    groups = x.reshape(*x.shape[:-1], -1, group_size)
    low = groups.amin(dim=-1, keepdim=True)
    scale = (groups.amax(dim=-1, keepdim=True) - low) / (2**bits - 1)
    return (((groups - low) / scale).round() * scale + low).reshape(x.shape)


def _truncated(x, bits, group_size):
    """Codes rounded down, not to the nearest."""
    groups = x.reshape(*x.shape[:-1], -1, group_size)
    low = groups.amin(dim=-1, keepdim=True)
    scale = ((groups.amax(dim=-1, keepdim=True) - low) / (2**bits - 1)).clamp(min=1e-12)
    return (((groups - low) / scale).floor() * scale + low).reshape(x.shape)


KNOWN_QUANTIZER_MISTAKES = (
    (
        _symmetric,
        "that is a symmetric quantizer (no zero point): a group of mostly positive values wastes half its "
        "codes; use min-max with a zero point",
    ),
    (
        _per_tensor,
        "one scale for the whole tensor: each group of group_size values needs its own min and max",
    ),
    (_truncated, "codes rounded down (floor) are off by up to a whole step: round to the nearest code"),
)

WRONG_ANSWERS = {
    "7.1": [512, 768, 1536, 2048, 8192, 256, 128, 32, "1024"],
    "7.2": [400.0, 821.9, 544.8, 868.4, 770.0, 671.7, 391_168, 24.45, 1000],
    "7.3": [
        [[2, 0, -1], [1, 3, 0], [0, -2, 3], [3, 1, 1]],  # the first head of each group kept
        [[6, 2, 0], [0, 4, 2], [2, 2, 2], [4, 0, 4]],  # summed
        [[1, -1, 1], [2, 2, 0.5], [3, 3, 0], [0, 0, 2.5]],  # heads 0 and 2, 1 and 3
        [[1.5, 1.5, -0.5], [1.5, 1.5, 1.5], [1.5, -0.5, 2], [1.5, 1.5, 1]],  # each head's rows averaged
        [[2, 1, 0.5], [1, 1, 1.5]],  # all four heads into one (MQA)
        [[3, 0, 1, 2], [1, 2, 1, 0], [0, 1, 1, 2]],  # transposed
        "pooled",
        None,
    ],
    "7.4": [[], [0, 1, 2, 3], [1, 2, 3, 4], list(range(1, 25)), [0, 1, 2, 3, *range(260, 384)], [1, 2], 3],
    "7.5": [
        _symmetric,
        _per_tensor,
        _no_zero_guard,
        _truncated,
        lambda x, bits, group_size: x.clone(),  # not quantized at all
        lambda x, bits, group_size: None,  # forgot to return
        "quantize_dequantize",
    ],
}

# What check("7.k", ...) says before the exercise is answered: a nudge, never the answer
FIRST_HINTS = {
    "7.1": (
        "count one key vector of 16 values first: its 4-bit codes, and what each group of 8 values stores "
        "beside them; then multiply by K and V, the KV heads and the layers"
    ),
    "7.2": (
        "split the 500 tokens into those already quantized (whole blocks of 128) and those still waiting "
        "in fp16, and price a token of each kind per KV head and layer"
    ),
    "7.3": (
        "query heads that read old heads 0 and 1 will read new head 0 (and 2 and 3, new head 1): a new "
        "head's row r is made from row r of the heads it replaces"
    ),
    "7.4": (
        "list the positions StreamingLLM holds when position 384 is read (its sinks and its most recent "
        "tokens), then keep those that belong to the register"
    ),
    "7.5": (
        "reshape the last dim into (groups, group_size), take each group's min and max with keepdim=True, "
        "and think about a group whose values are all equal"
    ),
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "7.1": (check_7_1, solve_7_1),
    "7.2": (check_7_2, solve_7_2),
    "7.3": (check_7_3, solve_7_3),
    "7.4": (check_7_4, solve_7_4),
    "7.5": (check_7_5, solve_7_5),
}
