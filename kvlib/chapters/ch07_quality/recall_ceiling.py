"""The best probe recall an eviction policy allows: is a probe's answer still among the kept tokens?

A late query of chapter 7's corpus asks about a fact whose value appears, before the query,
only in the register at the start of the document (:mod:`kvlib.train.corpus`). A cache that has
evicted it leaves the model nothing to copy from: it can at best guess among the key's eight
values (1 in 8). :func:`answer_ceiling` counts, from the tokens and the policy alone (no model),
the share of probes whose answer token is still held when the query is read: the ceiling on
that policy's recall, which the chapter prints beside the recall it measures. It applies to
policies whose kept set does not depend on attention (sliding window, StreamingLLM); H2O's
depends on the model's weights, so its ceiling is the full cache's.
"""

from __future__ import annotations

from kvlib import KVLibError
from kvlib.cache.eviction_policies import SlidingWindow, StreamingLLM
from kvlib.train.corpus import Documents


def answer_ceiling(docs: Documents, policy: SlidingWindow | StreamingLLM) -> float:
    """Share of the probes whose answer appears among the tokens ``policy`` holds when the query is read.

    The query's last token, at position p - 1, is fed with the tokens kept after position p - 2;
    the answer at p is available if an earlier position holding the same token is among them.
    """
    if not isinstance(policy, SlidingWindow | StreamingLLM):
        raise KVLibError(f"answer_ceiling needs a SlidingWindow or StreamingLLM, not {type(policy).__name__}")
    hits = total = 0
    for b, p in docs.probe_mask.nonzero().tolist():
        held = policy.kept_positions(range(p - 1)) if p - 1 > policy.budget else range(p - 1)
        answer = int(docs.tokens[b, p])
        hits += any(int(docs.tokens[b, q]) == answer for q in held)
        total += 1
    if not total:
        raise KVLibError("the documents have no probe")
    return hits / total
