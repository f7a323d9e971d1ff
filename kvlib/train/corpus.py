"""The corpus the quality chapter's model learns from: generated text with a retrieval probe (chapter 7).

Nothing is downloaded: every sequence is drawn from a seeded generator in this file, so the
corpus is ours (the repository's licence) and the same on every machine. A sequence of
``seq_len`` tokens is one *document*:

1. ``<bos>``, then a **register** of ``num_facts`` facts ``KEY VALUE ;`` in random order:
   distinct keys ``K0 .. K7``, each with one of its own eight values (``K3`` takes one of
   ``V30 .. V37``, drawn at random per document);
2. **text**: sentences of a small grammar (``the big cat sees a red dog .``) whose nouns come
   from the document's own **topic** (a few nouns drawn per document), so that remembering
   earlier sentences helps predict later ones;
3. between sentences, now and then, a **query** ``? KEY VALUE .`` about a fact of the
   register: before ``probe_from`` only about the register's first half, from ``probe_from`` on
   only about its second half, which no earlier query has repeated. So the value of a late
   query can only be found in the register, hundreds of tokens back: a cache that drops
   distant tokens loses it.

The probe score of a model is its accuracy at predicting ``VALUE`` after ``? KEY`` for the
first query about each late fact (chance is 1 in 8). Each key's values are its own,
so one attention head answers a query by looking for the one token of that key's value type,
which a model this small learns within its training budget; a key-to-any-value association
(any value for any key, answered by an induction head: find the earlier ``KEY``, copy the token
after it) was tried first and stayed at chance for 600 steps on 512-token documents, and at the
1-in-8 guess of "some value of this document" for 1,000 steps on 128-token ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib import KVLibError
from kvlib.checks import is_int

SPECIALS = ("<bos>", ".", "?", ";")
DETERMINERS = ("the", "a", "this", "every")
ADJECTIVES = tuple(
    "big small red blue old young quiet loud fast slow bright dark warm cold soft hard green tall".split()
)
NOUNS = tuple(
    (
        "cat dog bird fish horse mouse lion bear wolf fox owl frog goat sheep duck crow "
        "king queen child farmer baker sailor doctor teacher poet pilot judge miner "
        "river tree stone house road boat lamp door bell ship cloud hill garden tower bridge field"
    ).split()
)
VERBS = tuple("sees finds likes follows helps meets watches hears carries paints calls greets".split())
PREPOSITIONS = tuple("near under behind beside above with".split())
NUM_KEYS = 8  # key tokens K0 .. K7
NUM_VALUES = 8  # values per key: key k's are Vk0 .. Vk7
MAX_SEQ_LEN = 2**16  # longest document (a typo of 10**9 tokens would fill memory); the model reads 512


def vocabulary() -> tuple[str, ...]:
    """Every token of the corpus, in id order (specials first, then words, keys and values)."""
    keys = tuple(f"K{k}" for k in range(NUM_KEYS))
    values = tuple(f"V{k}{v}" for k in range(NUM_KEYS) for v in range(NUM_VALUES))
    return SPECIALS + DETERMINERS + ADJECTIVES + NOUNS + VERBS + PREPOSITIONS + keys + values


VOCAB = vocabulary()
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
assert len(TOKEN_ID) == len(VOCAB), "corpus tokens must be distinct"
FIRST_KEY = TOKEN_ID["K0"]  # key ids are FIRST_KEY .. FIRST_KEY + NUM_KEYS - 1
FIRST_VALUE = TOKEN_ID["V00"]  # key k's values are FIRST_VALUE + NUM_VALUES * k + (0 .. NUM_VALUES - 1)


@dataclass(frozen=True)
class CorpusConfig:
    """How documents are drawn; the defaults are those the shipped model was trained on."""

    seq_len: int = 512  # tokens per document (the model's context)
    num_facts: int = 8  # facts in each document's register
    num_topic_nouns: int = 6  # nouns a document's sentences draw from
    query_rate: float = 1.0  # chance of a query after each sentence (0.35 was too little to learn from)
    probe_from: int = 384  # queries starting at or after this position are the probe

    def __post_init__(self):
        for name in ("seq_len", "num_facts", "num_topic_nouns", "probe_from"):
            value = getattr(self, name)
            if not is_int(value):
                raise KVLibError(f"CorpusConfig.{name} must be an integer, not {value!r}")
        if not 1 <= self.num_facts <= NUM_KEYS:  # keys are distinct: at most NUM_KEYS facts
            raise KVLibError(f"CorpusConfig.num_facts must be 1 .. {NUM_KEYS}, not {self.num_facts!r}")
        if self.seq_len > MAX_SEQ_LEN:
            raise KVLibError(f"CorpusConfig.seq_len must be at most {MAX_SEQ_LEN:,}, not {self.seq_len:,}")
        if self.seq_len < 3 * self.num_facts + 16:  # the register, then room for a sentence or two
            raise KVLibError(
                f"CorpusConfig.seq_len must be at least {3 * self.num_facts + 16} (room after "
                f"{self.num_facts} facts), not {self.seq_len!r}"
            )
        if not 1 <= self.num_topic_nouns <= len(NOUNS):
            raise KVLibError(
                f"CorpusConfig.num_topic_nouns must be 1 .. {len(NOUNS)}, not {self.num_topic_nouns!r}"
            )
        rate = self.query_rate
        if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0.0 <= rate <= 1.0:  # nan fails
            raise KVLibError(f"CorpusConfig.query_rate must be a number in [0, 1], not {rate!r}")
        if not 0 <= self.probe_from < self.seq_len:
            raise KVLibError(
                f"CorpusConfig.probe_from must be in [0, seq_len = {self.seq_len}), not {self.probe_from!r}"
            )


@dataclass(frozen=True)
class Documents:
    """A batch of documents and where their probe answers are."""

    tokens: torch.Tensor  # (batch, seq_len) int64 token ids
    answer_mask: torch.Tensor  # (batch, seq_len) bool: True at every VALUE token of a query
    probe_mask: torch.Tensor  # (batch, seq_len) bool: the answers of queries at or after probe_from


def _sentence(gen: torch.Generator, topic: list[int]) -> list[int]:
    """One sentence: DET [ADJ] NOUN VERB DET [ADJ] NOUN [PREP DET NOUN] ."""

    def pick(options) -> int:
        return TOKEN_ID[options[int(torch.randint(len(options), (1,), generator=gen))]]

    def noun_phrase() -> list[int]:
        words = [pick(DETERMINERS)]
        if torch.rand((), generator=gen) < 0.5:
            words.append(pick(ADJECTIVES))
        return [*words, topic[int(torch.randint(len(topic), (1,), generator=gen))]]

    words = noun_phrase() + [pick(VERBS)] + noun_phrase()
    if torch.rand((), generator=gen) < 0.3:
        words += [pick(PREPOSITIONS), *noun_phrase()]
    return [*words, TOKEN_ID["."]]


def document(gen: torch.Generator, config: CorpusConfig) -> tuple[list[int], list[int], list[int]]:
    """One document's token ids, the positions of its query answers, and those of its probe answers."""
    keys = (torch.randperm(NUM_KEYS, generator=gen)[: config.num_facts] + FIRST_KEY).tolist()
    own = torch.randint(NUM_VALUES, (config.num_facts,), generator=gen).tolist()  # each key's value, 0 .. 7
    values = [FIRST_VALUE + NUM_VALUES * (key - FIRST_KEY) + v for key, v in zip(keys, own, strict=True)]
    num_early = config.num_facts - config.num_facts // 2  # the register's first half: asked before probe_from
    late = list(range(num_early, config.num_facts)) or list(range(num_early))  # asked from probe_from on
    nouns = torch.randperm(len(NOUNS), generator=gen)[: config.num_topic_nouns].tolist()
    topic = [TOKEN_ID[NOUNS[i]] for i in nouns]
    tokens = [TOKEN_ID["<bos>"]]
    for key, value in zip(keys, values, strict=True):
        tokens += [key, value, TOKEN_ID[";"]]
    answers, probes, probed = [], [], set()
    while len(tokens) < config.seq_len:
        if torch.rand((), generator=gen) < config.query_rate:
            start = len(tokens)
            asked = late if start >= config.probe_from else range(num_early)
            fact = asked[int(torch.randint(len(asked), (1,), generator=gen))]
            tokens += [TOKEN_ID["?"], keys[fact], values[fact], TOKEN_ID["."]]
            if start + 2 < config.seq_len:
                answers.append(start + 2)
                if start >= config.probe_from and fact not in probed:  # first asked: only in the register
                    probes.append(start + 2)
                    probed.add(fact)
        tokens += _sentence(gen, topic)
    return tokens[: config.seq_len], answers, probes


def documents(num_docs: int, seed: int, config: CorpusConfig | None = None) -> Documents:
    """``num_docs`` documents drawn from ``seed`` (the same seed always gives the same batch).

    ``seed`` is an integer in [0, 2**32): torch's CPU generator keeps only a seed's low 32 bits,
    so seeds 2**32 apart would draw the same documents (a validation seed of 2**40 would be the
    training seed 0). Training draws step ``s`` from ``data_seed * 2**20 + s``, the validation
    documents from :data:`~kvlib.train.trainer.VALIDATION_SEED`.
    """
    config = CorpusConfig() if config is None else config
    if not isinstance(config, CorpusConfig):
        raise KVLibError(f"config must be a CorpusConfig, not {type(config).__name__}")
    if not is_int(num_docs) or num_docs < 1:
        raise KVLibError(f"num_docs must be a positive integer, not {num_docs!r}")
    if not is_int(seed) or not 0 <= seed < 2**32:  # torch.Generator drops the higher bits
        raise KVLibError(f"seed must be an integer in [0, 2**32), not {seed!r}")
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.empty(num_docs, config.seq_len, dtype=torch.int64)  # (batch, seq_len)
    answer_mask = torch.zeros(num_docs, config.seq_len, dtype=torch.bool)  # (batch, seq_len)
    probe_mask = torch.zeros(num_docs, config.seq_len, dtype=torch.bool)  # (batch, seq_len)
    for i in range(num_docs):
        ids, answers, probes = document(gen, config)
        tokens[i] = torch.tensor(ids)
        answer_mask[i, answers] = True
        probe_mask[i, probes] = True
    return Documents(tokens, answer_mask, probe_mask)


def decode(ids) -> str:
    """Token ids as the words they stand for, separated by spaces (to show a document).

    ``ids`` is any sequence of integers (a list, a 1-D tensor); an id outside the corpus's
    vocabulary (``0 .. len(VOCAB) - 1``; the model's embedding table is larger) is refused
    rather than shown as another token (a negative index would wrap around).
    """
    if isinstance(ids, torch.Tensor):
        if ids.dim() > 1:
            raise KVLibError(f"decode takes one sequence of ids, not a tensor of shape {tuple(ids.shape)}")
        if ids.is_floating_point() or ids.is_complex():
            raise KVLibError(f"decode takes integer ids, not a {ids.dtype} tensor")
        ids = ids.reshape(-1).tolist()  # a 0-d tensor is one id
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise KVLibError(f"decode takes a sequence of token ids, not {type(ids).__name__}")
    words = []
    for i in ids:
        if not is_int(i) or not 0 <= i < len(VOCAB):
            raise KVLibError(f"token id {i!r} is not in the corpus's vocabulary (0 .. {len(VOCAB) - 1})")
        words.append(VOCAB[int(i)])
    return " ".join(words)
