"""Exercises of chapter 1: counting the wasted work, predicting the speedup, the concatenation
trap, the cross-attention cache, and writing a cache of your own.

Each ``check_1_k`` computes the expected value with kvlib (a simulation or the library's
own formula, never a typed-in number) and recognises the usual mistakes by the numbers
they produce.
"""

from __future__ import annotations

import torch

from kvlib.cache.contiguous import concat_bytes_copied, kv_bytes_per_token
from kvlib.cache.generation import generate, generate_encdec
from kvlib.chapters.ch01_no_cache.nocache_race import CPU_CONFIG
from kvlib.exercises.feedback import numeric_answer  # a number checked against the mistakes it is known for
from kvlib.model.attention import grouped_attention
from kvlib.model.config import ModelConfig
from kvlib.model.encdec import EncoderDecoder
from kvlib.model.llama import TinyLlama

# ---- 1.1 a quick count


def solve_1_1() -> int:
    """Step t (t = 1..400) runs the model over all t tokens so far: 1 + 2 + ... + 400."""
    n = 400
    return n * (n + 1) // 2


def check_1_1(answer):
    """Exercise 1.1: tokens the model runs over in 400 steps without a cache (1 + 2 + ... + 400).

    None if right, else a hint that names the likely mistake.
    """
    n = 400
    expected = sum(
        1 + step for step in range(n)
    )  # step 0 reads the 1-token prompt, step i reads 1 + i tokens
    return numeric_answer(
        answer,
        expected,
        {
            n
            * n: "that is n x n, but step t reads only the t tokens that exist by then: add 1 + 2 + ... + n",
            n * n / 2: "close: n^2 / 2 leaves out half of the diagonal; 1 + 2 + ... + n = n (n + 1) / 2",
            n
            * (n - 1)
            / 2: "you summed 0 + 1 + ... + (n - 1): the first step already reads the 1-token prompt",
            n: "that is the count WITH a cache (one token per step); without one every step rereads the past",
        },
        rel=0,
        what="the tokens read at each step, summed over the 400 steps",
    )


# ---- 1.2 predicting the speedup


def solve_1_2() -> float:
    """A cached step costs o; a no-cache step at length t costs o + c t. Sum both over n steps."""
    o, c, n = 1.5e-3, 40e-6, 400
    without = sum(o + c * t for t in range(1, n + 1))
    with_cache = n * o
    return without / with_cache


def check_1_2(answer):
    """Exercise 1.2: the cache's speedup over 400 steps when a step costs o, plus c per token without it.

    None if right, else a hint that names the likely mistake.
    """
    o, c, n = 1.5e-3, 40e-6, 400
    expected = 1 + c * (n + 1) / (2 * o)
    return numeric_answer(
        answer,
        expected,
        {
            n
            * (n + 1)
            / 2
            / n: "that is the ratio of tokens processed, which ignores the fixed cost o that every step pays",
            c
            * (n + 1)
            / (
                2 * o
            ): "that is the extra time over the cached run; the speedup is the ratio of the totals (add 1)",
            # 1 + c n / o lies within the tolerance of this one: the one hint names both slips
            1 + c * (n + 1) / o: (
                "the average no-cache step has length (n + 1) / 2, not n + 1 (or n): divide the growing "
                "term by 2"
            ),
        },
        rel=5e-3,
        what="total time without a cache over total time with one",
    )


# ---- 1.3 the concatenation trap


def solve_1_3() -> int:
    """At every step after the first, each layer's K and V are copied whole into a tensor one token longer."""
    c, n = CPU_CONFIG, 1000
    bytes_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4  # K and V, every layer, float32
    return bytes_per_token * sum(range(2, n + 1))  # the new tensors hold 2, 3, ..., n tokens


def check_1_3(answer):
    """Exercise 1.3: the bytes a cache grown by concatenation copies (kvlib's own count).

    None if right, else a hint that names the likely mistake.
    """
    c, n = CPU_CONFIG, 1000
    expected = concat_bytes_copied(c, n)  # unit tests check it against ConcatKVCache's own count
    per_token = kv_bytes_per_token(c)
    return numeric_answer(
        answer,
        expected,
        {
            expected
            * c.num_heads
            / c.num_kv_heads: "you used the 6 query heads; the cache stores num_kv_heads = 2 K/V heads",
            expected
            / 2: "a factor 2 is missing: each step copies the keys AND the values, in each of the 2 layers",
            expected / 4: "two factors of 2 are missing: keys AND values, in each of the 2 layers",
            expected + per_token: (
                "the first step copies nothing (there is no cache yet to copy): the sums start at 2 tokens"
            ),
            per_token
            * n
            * n
            / 2: "n^2 / 2 is an approximation; count exactly: the new tensors hold 2, 3, ..., n tokens",
        },
        rel=0,
        what="bytes per token x (2 + 3 + ... + n)",
    )


# ---- 1.4 the cross-attention cache


WHISPER_LARGE = dict(
    decoder_layers=32, heads=20, head_dim=64, source_frames=1500, max_new_tokens=448, bytes_per_value=2
)


def solve_1_4() -> int:
    """Cross-attention K and V cover the 1500 encoder frames, in every decoder layer; they never grow."""
    w = WHISPER_LARGE
    return 2 * w["decoder_layers"] * w["heads"] * w["head_dim"] * w["source_frames"] * w["bytes_per_value"]


def check_1_4(answer):
    """Exercise 1.4: Whisper-large's cross-attention cache, measured small and scaled to its shape.

    None if right, else a hint that names the likely mistake.
    """
    w = WHISPER_LARGE
    # Measure the cross-attention bytes of a small float32 model, then scale each factor to Whisper's shape.
    small = ModelConfig(
        vocab_size=64, d_model=32, num_layers=2, num_heads=2, num_kv_heads=2, d_ff=48, max_seq_len=64
    )
    run = generate_encdec(EncoderDecoder(small).eval(), torch.zeros(1, 10, dtype=torch.long), 3)
    values_per_slot = (
        run.cross_cache_bytes[-1] / 4 / (10 * small.num_layers * small.num_kv_heads * small.head_dim)
    )  # K and V
    slots = w["source_frames"] * w["decoder_layers"] * w["heads"] * w["head_dim"]
    expected = values_per_slot * slots * w["bytes_per_value"]
    self_bytes = expected / w["source_frames"] * w["max_new_tokens"]
    return numeric_answer(
        answer,
        expected,
        {
            self_bytes: (
                "that is the SELF-attention cache after 448 tokens; cross-attention K/V cover the "
                "1500 encoder frames"
            ),
            expected + self_bytes: "the question asks for the cross-attention cache alone, not both caches",
            expected / 2: "each frame stores a key AND a value per head: a factor 2 is missing",
            expected * 2: "float16 takes 2 bytes per value, not 4",
            expected
            * w[
                "max_new_tokens"
            ]: "the cross-attention cache does not grow with the generated tokens: it is computed once",
        },
        rel=0,
        what="2 x decoder layers x heads x head_dim x source frames x bytes",
    )


# ---- 1.5 write a cache


class ListKVCache:
    """A cache that keeps, per layer, a Python list of each step's K and V and joins them to attend."""

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int):
        self.k = [[] for _ in range(config.num_layers)]  # per layer: tensors (batch, kv_heads, new, head_dim)
        self.v = [[] for _ in range(config.num_layers)]
        self.batch_size, self.length, self.start = batch_size, 0, 0

    def prepare(self, num_new: int) -> torch.Tensor:
        """Make room for ``num_new`` tokens; their positions, (batch, num_new)."""
        self.start, self.length = self.length, self.length + num_new
        return torch.arange(self.start, self.length).expand(self.batch_size, num_new)

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        """Store this step's K and V of ``layer`` and attend ``q`` over every stored key."""
        self.k[layer].append(k)
        self.v[layer].append(v)
        keys, values = torch.cat(self.k[layer], dim=2), torch.cat(self.v[layer], dim=2)
        return grouped_attention(q, keys, values, q_start=self.start)


def solve_1_5():
    """The class itself: :class:`ListKVCache`."""
    return ListKVCache


_SMALL = ModelConfig(
    vocab_size=61, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48, max_seq_len=64, seed=3
)


def check_1_5(answer):
    """Exercise 1.5: a reader's cache class, run against the contiguous cache on the same model.

    None if right, else a hint that names the likely mistake.
    """
    if not isinstance(answer, type):
        return f"answer with the class itself (e.g. ListKVCache), not {type(answer).__name__}"
    try:
        probe = answer(_SMALL, 2, 16)
        first, second = probe.prepare(3), probe.prepare(1)
    except Exception as error:  # noqa: BLE001 - the reader's code may fail in any way; say how
        return (
            "the class must take (config, batch_size, max_len) and have prepare(num_new); it raised "
            f"{type(error).__name__}: {error}"
        )
    if not (
        torch.is_tensor(first)
        and first.tolist() == [[0, 1, 2]] * 2
        and torch.is_tensor(second)
        and second.tolist() == [[3]] * 2
    ):
        return (
            "prepare must return the positions of the new tokens, (batch, num_new): 0, 1, 2 for a "
            "3-token prompt, then 3"
        )
    model = TinyLlama(_SMALL).eval()
    prompt = torch.tensor([[5, 7, 11], [13, 17, 19]])
    reference = generate(model, prompt, 8, "none")
    cache, tokens = answer(_SMALL, 2, 16), prompt
    with torch.inference_mode():
        for step in range(8):
            try:
                logits = model(tokens if step == 0 else tokens[:, -1:], cache, last_only=True)[:, -1]
            except Exception as error:  # noqa: BLE001
                return f"the model failed with your cache at step {step}: {type(error).__name__}: {error}"
            if not torch.allclose(logits, reference.step_logits[step], atol=1e-4):
                if step == 0:
                    return (
                        "the prompt's logits are wrong: attend must store k, v and return attention "
                        "over all stored keys (grouped_attention with q_start)"
                    )
                return (
                    f"the prompt was right but step {step} was not: keep every earlier K and V, "
                    "separately for each layer, and attend to them all"
                )
            tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
    return None


# ---- realistic mistakes, which tests/test_exercises.py feeds to the checks


class _PositionsStayAtZero(ListKVCache):
    """Forgets to advance: every call says the new tokens start at position 0."""

    def prepare(self, num_new: int) -> torch.Tensor:
        super().prepare(num_new)
        return torch.arange(num_new).expand(self.batch_size, num_new)


class _ForgetsThePast(ListKVCache):
    """Stores K and V but attends only to the new ones."""

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        super().attend(layer, q, k, v)
        return grouped_attention(q, k, v)


class _OneListForAllLayers(ListKVCache):
    """Keeps every layer's K and V in the same list."""

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        return super().attend(0, q, k, v)


WRONG_ANSWERS = {
    "1.1": [160_000, 80_000, 79_800, 400, "80200"],
    "1.2": [200.5, 5.3467, 11.693, 11.667, 7.0],
    "1.3": [3_075_065_856, 512_510_976, 256_255_488, 1_025_024_000, 1_024_000_000],
    "1.4": [73_400_320, 319_160_320, 122_880_000, 491_520_000, 245_760_000 * 448],
    "1.5": [_PositionsStayAtZero, _ForgetsThePast, _OneListForAllLayers, ListKVCache(_SMALL, 1, 4), int],
}

# ---- what check(key, ...) says before the reader has answered: a nudge, not the answer

FIRST_HINTS = {
    "1.1": (
        "Without a cache, every step runs the model over all the tokens that exist by then. How many does "
        "the first step run over, the second, the last? Then add them up."
    ),
    "1.2": (
        "Write the total time of each way as a sum over the 400 steps: a cached step costs o, a step "
        "without the cache o plus c times its length. The speedup is the ratio of the two totals."
    ),
    "1.3": (
        "First work out the bytes that one token's keys and values take over both layers; then ask how "
        "many tokens the new tensors of each step hold."
    ),
    "1.4": (
        "Ask first whose positions cross-attention's keys and values belong to: the generated tokens, or "
        "the encoder's frames? Then multiply the factors, one at a time."
    ),
    "1.5": (
        "Start from the contiguous cache's attend in 'A real (tiny) decoder': keep K and V per layer "
        "(a Python list is enough), and let prepare remember where the new tokens start."
    ),
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "1.1": (check_1_1, solve_1_1),
    "1.2": (check_1_2, solve_1_2),
    "1.3": (check_1_3, solve_1_3),
    "1.4": (check_1_4, solve_1_4),
    "1.5": (check_1_5, solve_1_5),
}
