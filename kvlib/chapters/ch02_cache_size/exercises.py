"""Exercises of chapter 2: sizing KV caches by hand, the traps of real configs, capacity planning.

Each ``check_2_k`` compares with a value computed by :mod:`kvlib.sizing` (never typed in)
and recognises the usual mistakes by the numbers they produce.
"""

from __future__ import annotations

from kvlib.exercises.feedback import as_number, numeric_answer, returned_hint
from kvlib.sizing.capacity import max_batch, weight_bytes
from kvlib.sizing.catalog import catalog_config, catalog_entry
from kvlib.sizing.spec import bytes_per_token, cache_bytes
from kvlib.units import GiB

# What check("2.k", ...) says while the answer is still the blank: a nudge, never the answer.
FIRST_HINTS = {
    "2.1": (
        "Write out 2 x L x H_kv x D_head x S x B x b with this model's numbers; which heads does the "
        "cache store, the query heads or the KV heads?"
    ),
    "2.2": (
        "One token adds a key and a value per KV head in every layer; look carefully at where this "
        "config's head width comes from."
    ),
    "2.3": (
        "Not every layer keeps every token: count the layers that keep all 8,192 tokens and those that "
        "keep at most 4,096 separately, then add them up."
    ),
    "2.4": (
        "First find the memory left for caches (the GPU less the weights and the overhead), then divide "
        "it by one sequence's cache in each format and round down."
    ),
    "2.5": (
        "Start from the formula's bytes per token, then read the five configs with catalog_config(name): "
        "which keys give the layers, the heads and the head width, and which layers attend?"
    ),
}

# ---- 2.1 a quick calculation


def solve_2_1() -> float:
    """Llama-3-70B: 80 layers, 8 KV heads of 128, bf16 (2 bytes); 8 sequences of 8,192 tokens."""
    return 2 * 80 * 8 * 128 * 8192 * 8 * 2 / 1024**3


def check_2_1(answer):
    """Exercise 2.1: Llama-3-70B's cache for 8 x 8,192 tokens in bf16, in GiB (kvlib.sizing).

    None if right, else a hint that names the likely mistake.
    """
    expected = cache_bytes(catalog_entry("Llama-3-70B").spec, 8192, 8, "bf16") / GiB
    return numeric_answer(
        answer,
        expected,
        {
            expected
            * 8: "you used the 64 query heads; the cache stores only num_key_value_heads = 8 K/V heads",
            expected / 2: "a token stores a key AND a value per KV head: the factor 2 is missing",
            expected / 8: "that is one sequence; the batch holds 8",
            expected * 2: "bf16 takes 2 bytes per value, not 4",
            expected * GiB / 1e9: "that is in GB of 10^9 bytes; the book answers in GiB (1024^3 bytes)",
        },
        what="2 x layers x KV heads x head_dim x tokens x batch x bytes",
    )


# ---- 2.2 Gemma-2's head_dim


def solve_2_2() -> int:
    """Gemma-2-9B sets head_dim = 256 explicitly (hidden_size / heads would be 224)."""
    config = catalog_config("Gemma-2-9B")
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 2


def check_2_2(answer):
    """Exercise 2.2: Gemma-2-9B's bytes per token, with its explicit head_dim.

    None if right, else a hint that names the likely mistake.
    """
    gemma = catalog_entry("Gemma-2-9B").spec
    expected = bytes_per_token(gemma)
    return numeric_answer(
        answer,
        expected,
        {
            expected * 224 / 256: (
                "you used hidden_size/num_attention_heads = 224, but Gemma-2 sets head_dim = 256 explicitly"
            ),
            expected * 2: "you used the 16 attention heads; K and V have num_key_value_heads = 8 heads",
            expected / 2: "count both the key and the value of each KV head",
        },
        rel=0,
        what="2 x layers x KV heads x head_dim x 2 bytes",
    )


# ---- 2.3 Gemma-2's sliding windows


def solve_2_3() -> int:
    """Half of Gemma-2-9B's 42 layers keep at most 4,096 tokens; the other half keep all 8,192."""
    per_token_layer = 2 * 8 * 256 * 2
    return 21 * 8192 * per_token_layer + 21 * 4096 * per_token_layer


def check_2_3(answer):
    """Exercise 2.3: Gemma-2-9B's cache at 8,192 tokens, its sliding-window layers capped.

    None if right, else a hint that names the likely mistake.
    """
    gemma = catalog_entry("Gemma-2-9B").spec
    expected = cache_bytes(gemma, 8192)
    per_layer = 2 * 8 * 256 * 2
    return numeric_answer(
        answer,
        expected,
        {
            42
            * 8192
            * per_layer: "every other layer is a sliding-window layer: it keeps only the last 4,096 tokens",
            42 * 4096 * per_layer: (
                "only the even-numbered layers slide; the odd-numbered ones attend to all 8,192 tokens"
            ),
            expected * 224 / 256: "right windows, wrong width: Gemma-2's head_dim is 256, not 3584/16 = 224",
        },
        rel=0,
        what="the global layers (8,192 tokens) plus the sliding layers (4,096 tokens)",
    )


# ---- 2.4 capacity planning with a quantized cache

GPU, OVERHEAD, CONTEXT = 80 * GiB, 4 * GiB, 8192


def solve_2_4() -> dict:
    """Free memory = GPU - bf16 weights - overhead; divide by one sequence's cache, round down."""
    llama3 = catalog_entry("Llama-3-8B")
    free = GPU - llama3.num_parameters * 2 - OVERHEAD
    fp16_seq = 2 * 32 * 8 * 128 * CONTEXT * 2
    int4_vector = 128 // 2 + (128 // 32) * 4  # 4-bit values + an fp16 scale and zero point per 32
    int4_seq = 2 * 32 * 8 * int4_vector * CONTEXT
    return {"fp16": free // fp16_seq, "int4": free // int4_seq}


def check_2_4(answer):
    """Exercise 2.4: the largest batch of Llama-3-8B with an fp16 and an int4 cache.

    None if right, else a hint that names the likely mistake.
    """
    if not isinstance(answer, dict) or set(answer) != {"fp16", "int4"}:
        return 'answer with a dict {"fp16": sequences, "int4": sequences}'
    entry = catalog_entry("Llama-3-8B")
    weights = weight_bytes(entry.num_parameters, "bf16")
    right = {d: max_batch(entry.spec, CONTEXT, GPU, weights, OVERHEAD, d) for d in ("fp16", "int4")}
    if answer == right:
        return None
    free = GPU - weights - OVERHEAD
    fp16_seq = cache_bytes(entry.spec, CONTEXT)
    if answer["int4"] == free // (fp16_seq // 4):
        return (
            "int4 is not exactly 4x smaller: each group of 32 values also stores an fp16 scale and zero point"
        )
    if answer["fp16"] == (GPU - weights) // fp16_seq:
        return "subtract the 4 GiB overhead as well as the weights"
    if answer["fp16"] == (GPU - OVERHEAD) // fp16_seq:
        return "the bf16 weights (2 bytes x 8,030,261,248 parameters) take memory too"
    if answer["fp16"] == right["fp16"]:
        return (
            "fp16 is right; for int4 count 4 bits per value plus 4 bytes of scale and zero point per 32 "
            "values"
        )
    return (
        "free memory = 80 GiB - weights - 4 GiB; sequences = free // bytes of one 8,192-token cache "
        "(round down)"
    )


# ---- 2.5 a config reader


def solve_2_5():
    """A function: config.json dict -> fp16 KV bytes per token, handling the catalog's traps."""

    def kv_bytes_per_token(config: dict) -> int:
        layers = config.get("num_hidden_layers", config.get("n_layer"))  # Falcon spells it n_layer
        heads = config.get("num_attention_heads", config.get("n_head"))
        head_dim = config.get("head_dim") or config["hidden_size"] // heads  # Gemma sets head_dim
        kv_heads = 1 if config.get("multi_query") else config.get("num_key_value_heads", heads)
        period, offset = config.get("attn_layer_period", 1), config.get("attn_layer_offset", 0)
        attention_layers = sum(1 for i in range(layers) if i % period == offset)  # Jamba: 4 of 32
        return 2 * attention_layers * kv_heads * head_dim * 2

    return kv_bytes_per_token


CHECK_2_5_MODELS = {
    "Llama-2-7B": "the plain multi-head case",
    "Llama-3-8B": "use num_key_value_heads, not num_attention_heads",
    "Gemma-2-9B": "take head_dim from the config when it is there (Gemma-2: 256, not 3584/16)",
    "Jamba-v0.1": (
        "only layers with i % attn_layer_period == attn_layer_offset are attention layers (4 of 32)"
    ),
    "Falcon-7B": "Falcon's config says n_layer/n_head and multi_query: true, which means one KV head",
}


def check_2_5(answer):
    """Exercise 2.5: a reader's config dict -> fp16 bytes per token, fed the catalog's raw configs.

    None if right, else a hint that names the likely mistake.
    """
    if not callable(answer):
        return "answer with a function that takes a config dict and returns an int"
    for name, lesson in CHECK_2_5_MODELS.items():
        try:
            got = answer(dict(catalog_config(name)))
        except Exception as error:  # noqa: BLE001 - any failure of the reader's function is feedback
            return f"your function raised {type(error).__name__}: {error} on {name}'s config; {lesson}"
        if returned_hint(got, "a number of bytes"):
            return f"{returned_hint(got, 'a number of bytes')} for {name}'s config"
        got = as_number(got)
        if got != bytes_per_token(catalog_entry(name).spec):
            return f"wrong for {name} ({got:,} bytes): {lesson}"
    return None


def _ignores_head_dim(config: dict) -> int:
    return (
        2
        * config["num_hidden_layers"]
        * config.get("num_key_value_heads", 1)
        * config["hidden_size"]
        // config["num_attention_heads"]
        * 2
    )


def _ignores_jamba_layers(config: dict) -> int:
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    kv_heads = 1 if config.get("multi_query") else config.get("num_key_value_heads", heads)
    return 2 * layers * kv_heads * (config.get("head_dim") or config["hidden_size"] // heads) * 2


def _ignores_multi_query(config: dict) -> int:
    return solve_2_5()({**config, "multi_query": False})


WRONG_ANSWERS = {
    "2.1": [160.0, 10.0, 2.5, 40.0, 21.47, 19, "20", True],
    "2.2": [301_056, 688_128, 172_032, 344_000],
    "2.3": [2_818_572_288, 1_409_286_144, 1_849_688_064, 2_113_929_215],
    "2.4": [
        {"fp16": 61, "int4": 244},
        {"fp16": 65, "int4": 195},
        {"fp16": 76, "int4": 195},
        {"fp16": 61, "int4": 200},
        [61, 195],
    ],
    "2.5": [_ignores_head_dim, _ignores_jamba_layers, _ignores_multi_query, lambda config: 0, 42],
}

# every exercise of the chapter, key -> (check, reference solution): what kvlib.chapters.exercises reads
EXERCISES = {
    "2.1": (check_2_1, solve_2_1),
    "2.2": (check_2_2, solve_2_2),
    "2.3": (check_2_3, solve_2_3),
    "2.4": (check_2_4, solve_2_4),
    "2.5": (check_2_5, solve_2_5),
}
