"""A radix tree over token ids: SGLang's RadixAttention prefix cache (chapter 11).

The hash-based prefix cache of :class:`~kvlib.paged.block_pool.BlockPool` finds a prompt's cached
blocks one full block at a time, by a hash chained over the blocks before. SGLang (Zheng et al. 2024)
keeps every cached sequence in a *radix tree* instead: each edge holds a run of token ids, a node
ends wherever two cached sequences part, and a prompt's cached prefix is the path it walks from the
root. :class:`RadixTree` is that tree, readable rather than fast:

- ``page_size``: the granularity. An edge holds a whole number of pages, a match stops at a page
  boundary. SGLang's default is one token per page; ``page_size = block_size`` gives a tree with
  exactly the hash cache's granularity (a block is a page).
- :meth:`RadixTree.match_prefix`: the longest stored prefix of a sequence, in whole pages, and the
  values (block ids) stored along it. A match that ends inside an edge splits it there, so that the
  node returned ends exactly at the match (the node a request then locks).
- :meth:`RadixTree.insert`: store a sequence (its whole pages) with one value per page; returns how
  many of its leading tokens were stored already (whose values the caller keeps or frees).
- :meth:`RadixTree.lock` / :meth:`RadixTree.unlock`: a reference count on each node of a path, as
  SGLang's ``inc_lock_ref``: a running request locks the node its prefix ends at, so that nothing it
  reads is evicted.
- :meth:`RadixTree.evict`: remove least recently used *leaves* whose count is zero, until enough
  tokens are gone; a parent left childless becomes a leaf and may go next. A prefix therefore always
  outlives its continuations, and a referenced node is never removed.

:class:`kvlib.paged.radix_cache.RadixBlockManager` puts the tree in front of a block pool.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvlib import KVLibError
from kvlib.checks import require_int


def checked_tokens(tokens, name: str = "tokens") -> tuple[int, ...]:
    """``tokens`` as a tuple of non-negative integers (an empty sequence allowed)."""
    if isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence):
        raise KVLibError(f"{name} must be a list or tuple of token ids, not {type(tokens).__name__}")
    try:
        values = tuple(operator.index(t) for t in tokens)
    except TypeError:
        raise KVLibError(f"{name} must be integers, not {tokens!r}"[:200]) from None
    if values and min(values) < 0:
        raise KVLibError(f"{name} must be non-negative, not {min(values)}")
    return values


@dataclass(eq=False)
class RadixNode:
    """One node: the edge into it (``key``, whole pages), a value per page, its children by first page."""

    key: tuple[int, ...] = ()
    values: list = field(default_factory=list)  # one per page of key (block ids), or Nones
    parent: RadixNode | None = field(default=None, repr=False)
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict, repr=False)
    lock_ref: int = 0  # running requests whose matched prefix passes through this node
    last_access: int = 0  # the tree's clock when a match or an insert last walked through

    @property
    def is_leaf(self) -> bool:
        """No child: a candidate for eviction once nothing locks it."""
        return not self.children


@dataclass(frozen=True)
class PrefixMatch:
    """What :meth:`RadixTree.match_prefix` found."""

    num_tokens: int  # leading tokens stored in the tree (a whole number of pages)
    values: tuple  # one value per matched page (block ids), in order
    node: RadixNode  # the node the match ends at (the root when nothing matched)


class RadixTree:
    """A radix tree of token sequences in pages of ``page_size`` tokens, LRU eviction of free leaves."""

    def __init__(self, page_size: int = 1):
        self.page_size = require_int(page_size, "page_size")
        self.root = RadixNode()
        self.root.lock_ref = 1  # the root is never evicted
        self.num_tokens = 0  # tokens stored (every edge's key, summed)
        self.protected_tokens = 0  # of them, on nodes some request locks
        self.num_evicted_tokens = 0  # tokens evict() removed so far
        self._clock = 0

    # ------------------------------------------------------------------ helpers

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _page(self, tokens: tuple[int, ...], start: int = 0) -> tuple[int, ...]:
        return tokens[start : start + self.page_size]

    def _common_pages(self, key: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
        """Tokens (whole pages) that ``key`` shares with ``tokens[start:]`` from their start."""
        size, n = self.page_size, 0
        limit = min(len(key), len(tokens) - start)
        while n + size <= limit and key[n : n + size] == tokens[start + n : start + n + size]:
            n += size
        return n

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Cut ``child``'s edge after ``at`` tokens: a new node holds the first part, ``child`` the rest."""
        pages = at // self.page_size
        middle = RadixNode(child.key[:at], child.values[:pages], child.parent)
        middle.lock_ref, middle.last_access = child.lock_ref, child.last_access
        child.parent.children[self._page(child.key)] = middle
        child.key, child.values, child.parent = child.key[at:], child.values[pages:], middle
        middle.children[self._page(child.key)] = child
        return middle

    # ------------------------------------------------------------------ match / insert

    def match_prefix(self, tokens: Sequence[int]) -> PrefixMatch:
        """The longest prefix of ``tokens``, in whole pages (a partial last page never matches)."""
        tokens = checked_tokens(tokens)
        node, n, values, now = self.root, 0, [], self._tick()
        node.last_access = now
        while len(tokens) - n >= self.page_size:
            child = node.children.get(self._page(tokens, n))
            if child is None:
                break
            common = self._common_pages(child.key, tokens, n)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now
            values += child.values
            node, n = child, n + common  # the split (if any) made child end at the match
        return PrefixMatch(n, tuple(values), node)

    def insert(self, tokens: Sequence[int], values: Sequence | None = None) -> int:
        """Store the whole pages of ``tokens``, with ``values[i]`` for page ``i`` (default: ``None``s).

        Returns how many leading tokens were stored already: their pages keep their old values (the
        caller frees its own copies of them), the pages after get the new ones.
        """
        tokens = checked_tokens(tokens)
        num_pages = len(tokens) // self.page_size
        tokens = tokens[: num_pages * self.page_size]
        values = [None] * num_pages if values is None else list(values)
        if len(values) < num_pages:
            raise KVLibError(f"insert needs a value for each of the {num_pages} pages, got {len(values)}")
        node, n, now = self.root, 0, self._tick()
        while n < len(tokens):
            child = node.children.get(self._page(tokens, n))
            if child is None:
                leaf = RadixNode(tokens[n:], values[n // self.page_size : num_pages], node, last_access=now)
                node.children[self._page(leaf.key)] = leaf
                self.num_tokens += len(leaf.key)
                return n
            common = self._common_pages(child.key, tokens, n)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now
            node, n = child, n + common
        return n

    # ------------------------------------------------------------------ locks

    def lock(self, node: RadixNode) -> None:
        """One more running request reads the path from the root to ``node``."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.protected_tokens += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """The request that locked ``node`` is done with it."""
        while node is not self.root:
            if node.lock_ref <= 0:
                raise KVLibError("unlock of a node no request holds (unlocked twice?)")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_tokens -= len(node.key)
            node = node.parent

    @property
    def evictable_tokens(self) -> int:
        """Tokens that :meth:`evict` may remove: those on nodes no request locks."""
        return self.num_tokens - self.protected_tokens

    # ------------------------------------------------------------------ eviction

    def evict(self, num_tokens: int, on_evict: Callable[[list], None] | None = None) -> int:
        """Remove unlocked leaves, least recently used first, until ``num_tokens`` tokens are gone (or
        none is left to remove); ``on_evict(values)`` is told each removed leaf's values. Returns the
        tokens removed (whole leaves: possibly more than asked)."""
        num_tokens = require_int(num_tokens, "num_tokens", 0)
        leaves = [(n.last_access, id(n), n) for n in self._nodes() if n.is_leaf and n.lock_ref == 0]
        heapq.heapify(leaves)
        removed = 0
        while removed < num_tokens and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            del parent.children[self._page(leaf.key)]
            self.num_tokens -= len(leaf.key)
            removed += len(leaf.key)
            self.num_evicted_tokens += len(leaf.key)
            if on_evict is not None:
                on_evict(leaf.values)
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        return removed

    # ------------------------------------------------------------------ inspection

    def _nodes(self) -> list[RadixNode]:
        """Every node but the root, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def sequences(self) -> list[tuple[int, ...]]:
        """The stored sequences: the tokens from the root to each leaf."""
        out = []
        for node in self._nodes():
            if node.is_leaf:
                parts, up = [], node
                while up is not self.root:
                    parts.append(up.key)
                    up = up.parent
                out.append(tuple(t for part in reversed(parts) for t in part))
        return out

    def num_nodes(self) -> int:
        """Nodes besides the root."""
        return len(self._nodes())
