"""Tests of kvlib.train.corpus: seeded documents, their structure, and one-line errors (chapter 7).

Each structural claim of the module's docstring is checked on the documents themselves: the
register of distinct keys, every query answer and its value, the probe subset, and the
sentences' topic nouns."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import KVLibError
from kvlib.train.corpus import (
    FIRST_KEY,
    FIRST_VALUE,
    NOUNS,
    NUM_KEYS,
    NUM_VALUES,
    TOKEN_ID,
    VOCAB,
    CorpusConfig,
    decode,
    documents,
)
from tests.single_thread import one_torch_thread  # noqa: F401

BOS, QUERY, END_FACT = TOKEN_ID["<bos>"], TOKEN_ID["?"], TOKEN_ID[";"]
NOUN_IDS = {TOKEN_ID[n] for n in NOUNS}
SHORT = CorpusConfig(seq_len=96, probe_from=60)


def is_key(token: int) -> bool:
    return FIRST_KEY <= token < FIRST_KEY + NUM_KEYS


def is_value(token: int) -> bool:
    return FIRST_VALUE <= token < FIRST_VALUE + NUM_KEYS * NUM_VALUES  # 8 values for each of the 8 keys


def value_type(token: int) -> int:
    """The key whose values include ``token``: V30 .. V37 belong to K3."""
    return (token - FIRST_VALUE) // NUM_VALUES


def register_of(ids: list[int], num_facts: int) -> dict[int, int]:
    """KEY -> VALUE of a document's register, checking its layout: <bos> then (KEY VALUE ;) x num_facts."""
    assert ids[0] == BOS
    facts = [ids[1 + 3 * i : 4 + 3 * i] for i in range(num_facts)]
    for key, value, end in facts:
        assert is_key(key) and is_value(value) and end == END_FACT, decode(ids[: 1 + 3 * num_facts])
        assert value_type(value) == key - FIRST_KEY, decode([key, value])  # each key takes its own values
    register = {key: value for key, value, _ in facts}
    assert len(register) == num_facts, "the register's keys must be distinct"
    return register


def check_document(ids: list[int], answers: set[int], probes: set[int], config: CorpusConfig) -> None:
    """Every structural claim of kvlib.train.corpus on one document."""
    assert len(ids) == config.seq_len
    register = register_of(ids, config.num_facts)
    text_start = 1 + 3 * config.num_facts
    # Every answer is a VALUE after its KEY after "?", and it is the VALUE the register gives that KEY.
    for p in answers:
        assert p >= text_start + 2 and ids[p - 2] == QUERY and ids[p - 1] in register
        assert ids[p] == register[ids[p - 1]], (p, decode(ids[p - 2 : p + 1]))
    # Conversely, every "?" whose value lies inside the document marks an answer two tokens on.
    queries = [p for p in range(text_start, config.seq_len) if ids[p] == QUERY]
    assert answers == {p + 2 for p in queries if p + 2 < config.seq_len}
    # Before probe_from only the register's first half is asked, from probe_from on only its second
    # half (when it has one); the probe is the first query about each late key.
    order = [ids[1 + 3 * i] for i in range(config.num_facts)]
    num_early = config.num_facts - config.num_facts // 2
    early, late = set(order[:num_early]), set(order[num_early:]) or set(order[:num_early])
    first_late = {}
    for p in sorted(answers):
        assert ids[p - 1] in (late if p - 2 >= config.probe_from else early), (p, decode(ids[p - 2 : p + 1]))
        if p - 2 >= config.probe_from:
            first_late.setdefault(ids[p - 1], p)
    assert probes == set(first_late.values())
    # Keys and values appear only in the register and in queries; "?" and ";" nowhere else.
    in_queries = {p + k for p in queries for k in (0, 1, 2)}
    for p in range(text_start, config.seq_len):
        if p not in in_queries:
            assert not (is_key(ids[p]) or is_value(ids[p]) or ids[p] in (BOS, QUERY, END_FACT)), p
    # The sentences draw their nouns from the document's topic: at most num_topic_nouns distinct nouns.
    nouns = {t for t in ids[text_start:] if t in NOUN_IDS}
    assert 1 <= len(nouns) <= config.num_topic_nouns


def masks_as_sets(docs, i: int) -> tuple[list[int], set[int], set[int]]:
    ids = docs.tokens[i].tolist()
    answers = set(docs.answer_mask[i].nonzero().flatten().tolist())
    probes = set(docs.probe_mask[i].nonzero().flatten().tolist())
    return ids, answers, probes


def test_the_same_seed_gives_the_same_documents_and_another_seed_others():
    a, b, c = documents(3, 7, SHORT), documents(3, 7, SHORT), documents(3, 8, SHORT)
    for field in ("tokens", "answer_mask", "probe_mask"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert not torch.equal(a.tokens, c.tokens)
    # Within a batch the documents differ too (each draws its own register and topic).
    assert not torch.equal(a.tokens[0], a.tokens[1])


def test_seeds_use_all_32_bits():
    # torch's CPU generator keeps a seed's low 32 bits: seeds below 2**32 are the only distinct ones.
    assert not torch.equal(documents(1, 2**31, SHORT).tokens, documents(1, 0, SHORT).tokens)
    assert not torch.equal(documents(1, 2**32 - 1, SHORT).tokens, documents(1, 2**31 - 1, SHORT).tokens)


def test_shapes_and_dtypes_of_the_default_documents():
    docs = documents(2, 0)
    assert docs.tokens.shape == docs.answer_mask.shape == docs.probe_mask.shape == (2, 512)
    assert docs.tokens.dtype == torch.int64 and docs.answer_mask.dtype == docs.probe_mask.dtype == torch.bool
    assert int(docs.tokens.min()) >= 0 and int(docs.tokens.max()) < len(VOCAB)


def test_default_documents_have_the_documented_structure():
    docs = documents(4, 0)
    for i in range(4):
        ids, answers, probes = masks_as_sets(docs, i)
        check_document(ids, answers, probes, CorpusConfig())
        # With the default rate 0.35 a 512-token document holds many queries and several late ones;
        # the register ends at 25, so every probe's register lies 384 - 25 = 359+ tokens back.
        assert len(answers) >= 10 and len(probes) >= 1


def test_the_default_topic_uses_six_nouns():
    # 400+ tokens of sentences with 2-3 nouns each drawn from 6: every topic noun appears.
    ids, _, _ = masks_as_sets(documents(1, 3), 0)
    assert len({t for t in ids if t in NOUN_IDS}) == 6


@settings(max_examples=15, deadline=None)
@given(
    seq_len=st.integers(40, 160),
    num_facts=st.integers(1, 8),
    num_topic_nouns=st.integers(1, 10),
    query_rate=st.sampled_from([0.0, 0.35, 1.0]),
    probe_fraction=st.floats(0.0, 0.99),
    seed=st.integers(0, 2**32 - 1),
)
def test_structure_holds_for_other_configs(
    seq_len, num_facts, num_topic_nouns, query_rate, probe_fraction, seed
):
    config = CorpusConfig(seq_len, num_facts, num_topic_nouns, query_rate, int(probe_fraction * seq_len))
    docs = documents(2, seed, config)
    for i in range(2):
        ids, answers, probes = masks_as_sets(docs, i)
        check_document(ids, answers, probes, config)
        if query_rate == 0.0:
            assert not answers


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"seq_len": True}, "seq_len must be an integer, not True"),
        ({"seq_len": 512.0}, "seq_len must be an integer, not 512.0"),
        ({"seq_len": 39}, "seq_len must be at least 40"),  # 3 x 8 facts + 16
        ({"seq_len": 10**9}, "seq_len must be at most 65,536, not 1,000,000,000"),  # not 8 GB of zeros
        ({"num_facts": 0}, "num_facts must be 1 .. 8, not 0"),
        ({"num_facts": NUM_KEYS + 1}, "num_facts must be 1 .. 8, not 9"),
        ({"num_facts": 2.0}, "num_facts must be an integer"),
        ({"num_facts": False}, "num_facts must be an integer, not False"),
        ({"num_topic_nouns": 0}, "num_topic_nouns must be 1 .. 44"),
        ({"num_topic_nouns": len(NOUNS) + 1}, "num_topic_nouns must be 1 .. 44"),
        ({"num_topic_nouns": "6"}, "num_topic_nouns must be an integer"),
        ({"query_rate": math.nan}, "query_rate must be a number in [0, 1], not nan"),
        ({"query_rate": -0.1}, "query_rate must be a number in [0, 1]"),
        ({"query_rate": 1.5}, "query_rate must be a number in [0, 1]"),
        ({"query_rate": True}, "query_rate must be a number in [0, 1], not True"),
        ({"query_rate": "0.3"}, "query_rate must be a number in [0, 1]"),
        ({"probe_from": 512}, "probe_from must be in [0, seq_len = 512), not 512"),
        ({"probe_from": -1}, "probe_from must be in [0, seq_len = 512)"),
        ({"probe_from": 384.0}, "probe_from must be an integer, not 384.0"),
    ],
)
def test_bad_corpus_configs_are_one_line_errors(fields, message):
    with pytest.raises(KVLibError) as error:
        CorpusConfig(**fields)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 1), "num_docs must be a positive integer, not 0"),
        ((True, 1), "num_docs must be a positive integer, not True"),
        ((1.5, 1), "num_docs must be a positive integer"),
        ((1, -1), "seed must be an integer in [0, 2**32), not -1"),
        ((1, 2**32), "seed must be an integer in [0, 2**32)"),  # torch would draw seed 0's documents
        ((1, 2**40), "seed must be an integer in [0, 2**32)"),
        ((1, 1.0), "seed must be an integer"),
        ((1, 1, {"seq_len": 64}), "config must be a CorpusConfig, not dict"),
    ],
)
def test_bad_documents_arguments_are_one_line_errors(args, message):
    with pytest.raises(KVLibError) as error:
        documents(*args)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_decode_names_each_token():
    ids = [BOS, FIRST_KEY + 3, FIRST_VALUE + 63, END_FACT]
    assert decode(ids) == "<bos> K3 V77 ;"
    assert decode(torch.tensor(ids)) == decode(ids) and decode(torch.tensor(BOS)) == "<bos>"
    assert len(decode(documents(1, 0, SHORT).tokens[0]).split()) == 96


@pytest.mark.parametrize(
    "ids, message",
    [
        ([-1], "token id -1 is not in the corpus's vocabulary (0 .. 159)"),  # would wrap to V77
        ([len(VOCAB)], "token id 160 is not in"),  # the model's padded embeddings end at 191
        ([1.0], "token id 1.0 is not in"),
        (torch.zeros(2, 2, dtype=torch.long), "one sequence of ids"),
        (torch.zeros(2), "integer ids, not a torch.float32 tensor"),
        (5, "a sequence of token ids, not int"),
        ("the cat", "a sequence of token ids, not str"),
    ],
)
def test_decode_refuses_what_is_not_a_corpus_token(ids, message):
    with pytest.raises(KVLibError) as error:
        decode(ids)
    assert message in str(error.value)
