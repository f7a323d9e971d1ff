"""Property tests (hypothesis) over the arguments of kvlib's public library functions.

Every call either returns a right answer or raises a one-line KVLibError; never another exception,
a crash, inf or a wrong number:

- quantizers: any shape, dtype and finite value in fp16's range reads back finite, in its dtype,
  within half a scale (min-max) or fp8's relative precision;
- packing: codes that fit round-trip exactly; codes or lengths that do not are refused;
- block pool and block manager: random operation sequences, valid or not, against a reference
  model of the ref counts (never negative, free count = blocks with ref_cnt 0, no block both free
  and used);
- paged attend: random valid shapes match a plain softmax reference on the numba and torch decode
  paths; random invalid query shapes are KVLibErrors, run in a subprocess so that a crash of the
  compiled kernel fails the test instead of killing pytest.

The profile (tests/fuzz/conftest.py) sets the number of cases: a few in make unit, thousands with
HYPOTHESIS_PROFILE=fuzz.
"""

import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.model.config import ModelConfig
from kvlib.paged.block_manager import BlockManager
from kvlib.paged.block_pool import BlockPool
from kvlib.paged.paged_cache import PagedKVCache
from kvlib.quant.fp8 import quantize_fp8
from kvlib.quant.minmax import quantize_minmax
from kvlib.quant.packing import pack_codes, unpack_codes

ROOT = Path(__file__).resolve().parents[2]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LIMIT = {torch.float32: 65504.0, torch.float16: 65504.0, torch.bfloat16: 65280.0}  # in fp16's range
SPECIAL = [0.0, -0.0, 2.0**-24, -(2.0**-24), 2.0**-14, -(2.0**-14), 1.0, -1.0]


@st.composite
def float_tensors(draw):
    """A (rows, length) tensor of one of DTYPES, with limits, subnormals and mixed signs likely."""
    dtype = draw(st.sampled_from(DTYPES))
    rows, length = draw(st.integers(1, 3)), draw(st.integers(1, 40))
    top = LIMIT[dtype]
    value = st.one_of(
        st.sampled_from([*SPECIAL, top, -top]), st.floats(-top, top, allow_nan=False, allow_subnormal=True)
    )
    values = draw(st.lists(value, min_size=rows * length, max_size=rows * length))
    return torch.tensor(values, dtype=torch.float32).view(rows, length).to(dtype)


def cast_rounding(back: torch.Tensor) -> torch.Tensor:
    """What the cast of a float32 read-back into its 16-bit dtype may move it (0 for float32)."""
    return back.float().abs() * (torch.finfo(back.dtype).eps if back.dtype != torch.float32 else 0.0)


@given(float_tensors(), st.sampled_from([2, 4, 8]), st.integers(1, 45))
def test_minmax_reads_back_finite_within_half_a_scale(x, bits, group_size):
    q = quantize_minmax(x, bits, group_size)
    back = q.dequantize()
    assert back.shape == x.shape and back.dtype == x.dtype and bool(back.isfinite().all())
    scale = q.scale.float().repeat_interleave(group_size, -1)[..., : x.shape[-1]]
    error = (back.float() - x.float()).abs()
    assert bool((error <= scale / 2 + cast_rounding(back) + 1e-30).all())
    assert bool((q.codes() <= 2**bits - 1).all())


@given(float_tensors(), st.one_of(st.none(), st.integers(1, 45)))
def test_fp8_reads_back_finite_within_its_precision(x, group_size):
    q = quantize_fp8(x, group_size)
    back = q.dequantize()
    assert back.shape == x.shape and back.dtype == x.dtype and bool(back.isfinite().all())
    size = x.shape[-1] if group_size is None else group_size
    scale = q.scale.float().repeat_interleave(size, -1)[..., : x.shape[-1]]
    error = (back.float() - x.float()).abs()
    bound = x.float().abs() * 2.0**-4 + scale * 2.0**-9 + cast_rounding(back) + 1e-30
    assert bool((error <= bound).all())


@given(st.sampled_from([2, 4, 8]), st.integers(0, 3), st.integers(0, 50), st.data())
def test_pack_unpack_round_trip(bits, rows, length, data):
    values = data.draw(st.lists(st.integers(0, 2**bits - 1), min_size=rows * length, max_size=rows * length))
    codes = torch.tensor(values, dtype=torch.uint8).view(rows, length)
    packed = pack_codes(codes, bits)
    assert packed.shape[-1] == math.ceil(length * bits / 8)
    assert torch.equal(unpack_codes(packed, bits, length), codes)


@given(st.sampled_from([2, 4]), st.integers(1, 20), st.integers(-5, 100), st.data())
def test_misfit_codes_and_lengths_are_refused(bits, length, asked, data):
    too_big = data.draw(st.integers(2**bits, 255))
    codes = torch.zeros(length, dtype=torch.uint8)
    codes[data.draw(st.integers(0, length - 1))] = too_big
    with pytest.raises(KVLibError, match="codes must lie in"):
        pack_codes(codes, bits)
    packed = pack_codes(torch.zeros(length, dtype=torch.uint8), bits)
    if packed.shape[-1] == math.ceil(asked * bits / 8) and asked >= 0:
        assert unpack_codes(packed, bits, asked).shape == (asked,)
    else:
        with pytest.raises(KVLibError, match="length"):
            unpack_codes(packed, bits, asked)


# ---------------------------------------------------------------- block pool and manager

ODD_VALUES = [None, 1.5, -1, True, "x", [1], 10**9]


def check_pool(pool: BlockPool, refs: dict[int, int]) -> None:
    """The pool agrees with the reference counts; free blocks are exactly those no table uses."""
    assert [b.ref_cnt for b in pool.blocks] == [refs[i] for i in range(len(pool.blocks))]
    assert min(refs.values()) >= 0
    free = set(pool.free_queue.block_ids())
    assert free == {i for i, n in refs.items() if n == 0} and pool.num_free_blocks == len(free)


@given(st.integers(1, 6), st.lists(st.tuples(st.sampled_from("take touch free"), st.data()), max_size=25))
def test_pool_operations_match_a_reference_of_ref_counts(num_blocks, operations):
    pool, refs = BlockPool(num_blocks), dict.fromkeys(range(num_blocks), 0)
    for name, data in operations:
        used = [pool.blocks[i] for i, n in refs.items() if n > 0]
        try:
            if name == "take":
                num = data.draw(st.one_of(st.integers(-1, num_blocks + 1), st.sampled_from(ODD_VALUES)))
                for block in pool.get_new_blocks(num):
                    refs[block.block_id] = 1
            elif name == "touch":
                block = data.draw(st.sampled_from(pool.blocks))
                pool.touch(block)
                refs[block.block_id] += 1
            else:
                chosen = data.draw(st.lists(st.sampled_from(pool.blocks), max_size=4)) if used else []
                argument = data.draw(st.sampled_from([chosen, None, 3, tuple(chosen)]))
                pool.free_blocks(argument)
                for block in chosen:
                    refs[block.block_id] -= 1
        except KVLibError as error:
            assert "\n" not in str(error)
        check_pool(pool, refs)


SEQ_IDS = [0, 1, 2, "a", [1], None]


def check_manager(manager: BlockManager) -> None:
    """ref_cnt = the block-table entries naming the block; free = unused; no block free and used."""
    uses = Counter(b for seq in manager.sequences.values() for b in seq.block_table)
    for block in manager.pool.blocks:
        assert block.ref_cnt == uses[block.block_id] >= 0
    free = set(manager.pool.free_queue.block_ids())
    assert free.isdisjoint(uses) and len(free) == manager.num_blocks - len(uses) == manager.num_free_blocks
    for seq in manager.sequences.values():
        assert len(seq.block_table) == math.ceil(seq.num_tokens / manager.block_size)


def manager_step(manager: BlockManager, tokens: dict, name: str, data) -> None:
    """One operation of the manager with drawn (possibly invalid) arguments."""
    seq = data.draw(st.sampled_from(SEQ_IDS))
    if name == "allocate":
        prompt = data.draw(st.one_of(st.lists(st.integers(0, 2), max_size=9), st.sampled_from(ODD_VALUES)))
        if manager.allocate(seq, prompt) is not None:
            tokens[seq] = prompt
    elif name == "append" and seq in manager and isinstance(tokens.get(seq), list):
        tokens[seq].append(data.draw(st.integers(0, 2)))
        if manager.append_slot(seq) is None:
            tokens[seq].pop()
    elif name == "compute":
        manager.mark_computed(seq, data.draw(st.one_of(st.none(), st.integers(-1, 12), st.just(1.5))))
    elif name == "fork":  # the child's token list, under the child's id (a separate draw could be [1])
        child = data.draw(st.sampled_from(SEQ_IDS))
        tokens[child] = manager.fork(seq, child)  # an unhashable child is refused before the assignment
    elif name == "free":
        manager.free(seq)
    else:
        manager.ref_cnt(
            data.draw(st.one_of(st.integers(-2, manager.num_blocks + 1), st.sampled_from(ODD_VALUES)))
        )
        manager.slot(seq, data.draw(st.one_of(st.integers(-2, 12), st.sampled_from(ODD_VALUES))))


@given(
    st.integers(1, 8),
    st.integers(1, 4),
    st.booleans(),
    st.lists(
        st.tuples(st.sampled_from("allocate append compute fork free query".split()), st.data()), max_size=30
    ),
)
def test_manager_operations_keep_the_ref_counts(num_blocks, block_size, prefix_caching, operations):
    manager, tokens = BlockManager(num_blocks, block_size, prefix_caching), {}
    for name, data in operations:
        try:
            manager_step(manager, tokens, name, data)
        except KVLibError as error:
            assert "\n" not in str(error)
        check_manager(manager)
    for seq in list(manager.sequences):
        manager.free(seq)
    assert manager.num_free_blocks == num_blocks


# ---------------------------------------------------------------- paged attend


def reference_decode(q, keys, values):
    """Softmax attention of one query per sequence over its own K/V, heads grouped: plain float64."""
    out = []
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):  # k, v: (kv_heads, seq, head_dim)
        group = q.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(group, 0).double(), v.repeat_interleave(group, 0).double()
        scores = (q[b].double() @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])  # (heads, 1, seq)
        out.append(torch.softmax(scores, -1) @ v)  # (heads, 1, head_dim)
    return torch.stack(out)


@st.composite
def decode_cases(draw):
    num_kv_heads, group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([2, 4, 8, 16]))
    config = ModelConfig(
        vocab_size=8,
        d_model=num_kv_heads * group * head_dim,
        num_layers=2,
        num_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads,
        d_ff=8,
    )
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=3))
    return config, draw(st.integers(1, 5)), lengths, draw(st.sampled_from(["numba", "torch"]))


def prefilled(config, block_size, lengths, kernel, seed=0):
    """A paged cache holding sequences of ``lengths`` tokens of random K/V, each given one new token and
    prepared for a decode step; returns it with each sequence's K/V so far."""
    generator = torch.Generator().manual_seed(seed)
    num_blocks = sum(math.ceil((n + 1) / block_size) for n in lengths)
    cache = PagedKVCache(config, num_blocks, block_size, enable_prefix_caching=False)
    cache.decode_kernel = kernel
    shape = (1, config.num_kv_heads)
    keys, values = [], []
    for seq, length in enumerate(lengths):
        tokens = list(range(length))
        cache.manager.allocate(seq, tokens)
        cache.schedule([seq])
        cache.prepare(length)
        k = torch.randn(*shape, length, config.head_dim, generator=generator)
        v = torch.randn(*shape, length, config.head_dim, generator=generator)
        for layer in range(config.num_layers):
            cache.attend(layer, torch.randn(1, config.num_heads, length, config.head_dim), k, v)
        tokens.append(0)
        cache.manager.append_slot(seq)
        keys.append(k[0])
        values.append(v[0])
    cache.schedule(list(range(len(lengths))))
    cache.prepare(1)
    return cache, keys, values


@given(decode_cases())
def test_paged_decode_matches_the_reference(case):
    config, block_size, lengths, kernel = case
    cache, keys, values = prefilled(config, block_size, lengths, kernel)
    batch = len(lengths)
    q = torch.randn(batch, config.num_heads, 1, config.head_dim)
    k = torch.randn(batch, config.num_kv_heads, 1, config.head_dim)
    v = torch.randn(batch, config.num_kv_heads, 1, config.head_dim)
    out = cache.attend(0, q, k, v)
    keys = [torch.cat([old, k[b]], 1) for b, old in enumerate(keys)]
    values = [torch.cat([old, v[b]], 1) for b, old in enumerate(values)]
    torch.testing.assert_close(out.double(), reference_decode(q, keys, values), rtol=1e-4, atol=1e-5)


def invalid_attend_cases(num_cases: int, seed: int) -> int:
    """Run ``num_cases`` decode steps with a query of a wrong batch, head count or head_dim on the numba
    path; each must be a KVLibError. Returns the cases run (called in a subprocess: a crash is exit 139)."""
    generator = torch.Generator().manual_seed(seed)
    config = ModelConfig(vocab_size=8, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=8)
    cache, _, _ = prefilled(config, 3, [5, 2], "numba")
    kv = torch.randn(2, 2, 1, config.head_dim)
    run = 0
    while run < num_cases:
        batch, heads, head_dim = (int(n) for n in torch.randint(1, 12, (3,), generator=generator))
        if batch == 2 and heads % 2 == 0 and head_dim == config.head_dim:
            continue  # a valid query
        try:
            cache.attend(0, torch.randn(batch, heads, 1, head_dim), kv, kv)
        except KVLibError:
            run += 1
        else:
            raise AssertionError(f"q {(batch, heads, 1, head_dim)} was accepted")
    return run


def test_invalid_queries_are_errors_not_crashes():
    num_cases = 2000 if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz" else 200
    call = f"invalid_attend_cases({num_cases}, 0)"
    code = f"from tests.fuzz.test_library_fuzz import invalid_attend_cases; print({call})"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == str(num_cases)
