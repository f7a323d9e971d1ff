"""A model's layer stack as a few repeated patterns, so that sizes never loop over layers (chapter 2).

Real models repeat a short pattern of layer kinds: every layer alike (Llama), one global
layer in six (Gemma-3), one attention layer in eight (Jamba), a window from some layer on
(Qwen2). :class:`LayerGroups` keeps such a stack as :class:`LayerRun` s (a pattern of
:class:`LayerKind` s repeated some number of times), so that :meth:`LayerGroups.counts`
answers "how many layers of each kind lie in layers ``start`` to ``stop``" in time that
depends on the pattern's length, not on the number of layers: a config claiming 10**12
layers is sized in microseconds, and a pipeline stage (:mod:`kvlib.sizing.parallel`) is
one more range. :class:`AttentionLayers` and :class:`SlidingWindows` are read-only
sequence views of the same stack (the per-layer tuples ``ModelSpec.attention_layers`` and
``ModelSpec.sliding_windows`` that chapters 2 and 5 index and compare), built without
listing the layers.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import islice

from kvlib import KVLibError
from kvlib.checks import MAX_MESSAGE, is_int, require_int, shown

# Every count kvlib sizes (layers, heads, values per head, windows, tokens, sequences) is at most this:
# far above any published model (a few hundred layers, a few million tokens of context), and low
# enough that every byte count of such counts stays a finite float when it is shown in GiB.
MAX_COUNT = 10**12
# A layer stack given layer by layer (a config's layer_types, hybrid_override_pattern,
# attn_layer_indices, ...; a pattern period; a hand-built spec's attention_layers) may list at most
# this many layers: far above any published model, and few enough to read in well under a second.
MAX_LISTED_LAYERS = 1_000_000

# Stacks up to this many layers are stored in one canonical form (their shortest repeating
# pattern), so that two descriptions of the same stack compare equal.
CANONICAL_LAYERS = 4096


@dataclass(frozen=True)
class LayerKind:
    """What one layer keeps in the KV cache."""

    caches: bool = True  # keeps K/V (False: Mamba, linear attention, ... layers with a fixed-size state)
    window: int | None = None  # most tokens it keeps (sliding window, attention chunk); None: all
    num_kv_heads: int | None = (
        None  # its own KV heads when they differ per layer (OpenELM); None: the model's
    )
    fixed_tokens: int | None = (
        None  # caches this many tokens whatever the context (cross-attention to images)
    )

    def tokens(self, context: int) -> int:
        """Tokens this layer keeps of a ``context``-token sequence (0 if it caches nothing)."""
        if not self.caches:
            return 0
        if self.fixed_tokens is not None:
            return self.fixed_tokens
        return context if self.window is None else min(context, self.window)


FULL_ATTENTION = LayerKind()
NO_CACHE = LayerKind(caches=False)


@dataclass(frozen=True)
class LayerRun:
    """``repeats`` consecutive copies of ``pattern``."""

    pattern: tuple[LayerKind, ...]  # kinds of consecutive layers
    repeats: int  # how many times the pattern repeats

    @property
    def num_layers(self) -> int:
        """Layers this run spans."""
        return len(self.pattern) * self.repeats

    @cached_property
    def offsets(self) -> dict[LayerKind, list[int]]:
        """Per kind, its increasing offsets in the pattern (computed once: a long listed pattern is
        walked once, and every count after it is a bisection)."""
        where: dict[LayerKind, list[int]] = {}
        for offset, kind in enumerate(self.pattern):
            where.setdefault(kind, []).append(offset)
        return where

    def count_below(self, x: int) -> dict[LayerKind, int]:
        """How many of this run's first ``x`` layers are of each kind."""
        period = len(self.pattern)
        full, rest = divmod(x, period)
        return {kind: full * len(at) + bisect_left(at, rest) for kind, at in self.offsets.items()}


@dataclass(frozen=True)
class LayerGroups:
    """A stack of layers as runs of repeated patterns (see the module docstring)."""

    runs: tuple[LayerRun, ...]  # consecutive runs, first layer first

    @property
    def num_layers(self) -> int:
        """Layers in the stack."""
        return sum(run.num_layers for run in self.runs)

    @classmethod
    def uniform(cls, kind: LayerKind, num_layers: int) -> LayerGroups:
        """``num_layers`` layers all of one kind."""
        return cls((LayerRun((kind,), num_layers),)).canonical()

    @classmethod
    def periodic(cls, pattern: Sequence[LayerKind], num_layers: int) -> LayerGroups:
        """Layer i of kind ``pattern[i % len(pattern)]`` for i < ``num_layers``."""
        pattern = tuple(pattern)
        _check_listed(len(pattern))
        full, rest = divmod(num_layers, len(pattern))
        runs = [LayerRun(pattern, full)] if full else []
        if rest:
            runs.append(LayerRun(pattern[:rest], 1))
        return cls(tuple(runs)).canonical()

    @classmethod
    def from_kinds(cls, kinds: Sequence[LayerKind]) -> LayerGroups:
        """One kind per layer, as a config that lists its layers gives them."""
        _check_listed(len(kinds))
        return cls((LayerRun(tuple(kinds), 1),)).canonical()

    @classmethod
    def concat(cls, *parts: LayerGroups) -> LayerGroups:
        """The stacks one after the other (Qwen2: full layers, then windowed ones)."""
        return cls(tuple(run for part in parts for run in part.runs)).canonical()

    def canonical(self) -> LayerGroups:
        """The same stack in a form that makes equal stacks compare equal.

        Empty runs go; a stack of at most :data:`CANONICAL_LAYERS` layers becomes its
        shortest repeating pattern; a longer one keeps its runs, each reduced to its shortest
        period, with equal neighbours merged.
        """
        runs = []
        for run in self.runs:
            if not run.repeats or not run.pattern:
                continue
            period = _shortest_period(run.pattern)
            run = LayerRun(period, run.repeats * (len(run.pattern) // len(period)))
            if runs and runs[-1].pattern == run.pattern:
                run = LayerRun(run.pattern, runs[-1].repeats + run.repeats)
                runs.pop()
            runs.append(run)
        if len(runs) > 1 and sum(r.num_layers for r in runs) <= CANONICAL_LAYERS:
            kinds = tuple(kind for run in runs for _ in range(run.repeats) for kind in run.pattern)
            period = _shortest_period(kinds)
            runs = [LayerRun(period, len(kinds) // len(period))]
        return LayerGroups(tuple(runs))

    def kind_of(self, layer: int) -> LayerKind:
        """The kind of layer ``layer`` (0-based)."""
        start = 0
        for run in self.runs:
            if layer < start + run.num_layers:
                return run.pattern[(layer - start) % len(run.pattern)]
            start += run.num_layers
        raise IndexError(layer)

    def counts(self, start: int = 0, stop: int | None = None) -> dict[LayerKind, int]:
        """How many of layers ``start`` .. ``stop - 1`` are of each kind (kinds with none left out)."""
        stop = self.num_layers if stop is None else stop
        counts: dict[LayerKind, int] = {}
        first = 0
        for run in self.runs:
            lo, hi = max(start, first) - first, min(stop, first + run.num_layers) - first
            first += run.num_layers
            if lo >= hi:
                continue
            high, low = run.count_below(hi), run.count_below(lo)
            for kind, n in high.items():
                if n - low[kind]:
                    counts[kind] = counts.get(kind, 0) + n - low[kind]
        return counts

    def with_each(self, **changes) -> LayerGroups:
        """The same stack with ``changes`` applied to every kind (``dataclasses.replace``)."""
        return LayerGroups(
            tuple(LayerRun(tuple(replace(k, **changes) for k in r.pattern), r.repeats) for r in self.runs)
        ).canonical()

    def kinds(self):
        """Every layer's kind, first layer first (a generator: walking it costs one step per layer)."""
        for run in self.runs:
            for _ in range(run.repeats):
                yield from run.pattern


def require_count(value, name: str, low: int = 1) -> int:
    """``value`` as an int if it is an integer from ``low`` to :data:`MAX_COUNT`; else a KVLibError
    naming ``name``, the value and the bound it breaks (require_int's words below ``low``)."""
    value = require_int(value, name, low)
    if value > MAX_COUNT:
        raise KVLibError(
            f"{name} must be at most {MAX_COUNT:,} (kvlib's bound on counts), not {shown(value)}"[
                :MAX_MESSAGE
            ]
        )
    return value


def _check_listed(n: int) -> None:
    if n > MAX_LISTED_LAYERS:
        raise KVLibError(
            f"a layer pattern of {n:,} layers is beyond the {MAX_LISTED_LAYERS:,} that kvlib lists "
            "layer by layer"
        )


def _shortest_period(kinds: tuple[LayerKind, ...]) -> tuple[LayerKind, ...]:
    n = len(kinds)
    for d in range(1, n):
        if n % d == 0 and kinds[d:] == kinds[:-d]:  # shifting by d changes nothing: period d
            return kinds[:d]
    return kinds


class _LayerView(Sequence):
    """A read-only sequence computed from a :class:`LayerGroups` without listing its layers."""

    def __init__(self, groups: LayerGroups):
        self.groups = groups

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        if not is_int(index):
            raise TypeError(f"{type(self).__name__} indices must be integers, not {type(index).__name__}")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._item(index)

    def __eq__(self, other):
        if isinstance(other, _LayerView) and type(other) is type(self) and other.groups == self.groups:
            return True
        if not isinstance(other, (tuple, list, _LayerView)) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self):
        return hash((type(self).__name__, self.groups))

    def __repr__(self):
        if len(self) <= 64:
            return repr(tuple(self))
        return f"{type(self).__name__}({len(self):,} entries: {tuple(islice(self, 8))} ...)"


class AttentionLayers(_LayerView):
    """Indices of the layers that keep a KV cache, increasing (``ModelSpec.attention_layers``)."""

    def __len__(self):
        return sum(n for kind, n in self.groups.counts().items() if kind.caches)

    def __iter__(self):
        return (i for i, kind in enumerate(self.groups.kinds()) if kind.caches)

    def _item(self, index: int) -> int:
        first = 0
        for run in self.groups.runs:
            offsets = [i for i, kind in enumerate(run.pattern) if kind.caches]
            in_run = len(offsets) * run.repeats
            if index < in_run:
                return first + (index // len(offsets)) * len(run.pattern) + offsets[index % len(offsets)]
            index -= in_run
            first += run.num_layers
        raise IndexError(index)  # unreachable: __getitem__ checked the range


class SlidingWindows(_LayerView):
    """Per layer, the window that caps its cache, or None (``ModelSpec.sliding_windows``)."""

    def __len__(self):
        return self.groups.num_layers

    def __iter__(self):
        return (kind.window for kind in self.groups.kinds())

    def _item(self, index: int) -> int | None:
        return self.groups.kind_of(index).window


def groups_from_lists(
    num_layers: int, attention_layers, sliding_windows, base: LayerGroups | None, limit: int
) -> LayerGroups:
    """The stack that per-layer ``attention_layers`` / ``sliding_windows`` describe (None: from ``base``).

    This lists the layers, so it is refused beyond ``limit`` layers; configs and the catalog
    never come here (they build :class:`LayerGroups` directly).
    """
    if num_layers > limit:
        raise KVLibError(
            f"per-layer attention_layers/sliding_windows are accepted for up to {limit:,} layers, "
            f"not {num_layers:,}; describe longer stacks with layer_groups"
        )
    kinds = list(base.kinds()) if base is not None else [FULL_ATTENTION] * num_layers
    if attention_layers is not None:
        layers = _as_tuple(attention_layers, "attention_layers", num_layers)
        if (
            any(not is_int(i) for i in layers)
            or sorted(set(layers)) != list(layers)
            or (layers and (layers[0] < 0 or layers[-1] >= num_layers))
        ):
            raise KVLibError(
                f"attention_layers must be increasing indices in 0..{num_layers - 1}, not {layers}"[:200]
            )
        chosen = set(layers)
        kinds = [replace(k, caches=i in chosen) for i, k in enumerate(kinds)]
    if sliding_windows is not None:
        windows = _as_tuple(sliding_windows, "sliding_windows", num_layers)
        if len(windows) != num_layers:
            raise KVLibError(f"sliding_windows has {len(windows)} entries for {num_layers} layers")
        for window in windows:
            if window is not None and (not is_int(window) or window < 1):
                raise KVLibError(f"sliding_window must be an integer >= 1, not {window!r}")
        kinds = [replace(k, window=w) for k, w in zip(kinds, windows, strict=True)]
    return LayerGroups.from_kinds(kinds)


def _as_tuple(values, name: str, num_layers: int) -> tuple:
    """A per-layer list or tuple as a tuple; a KVLibError naming ``name`` for anything else."""
    is_list = isinstance(values, Sequence) and not isinstance(values, (str, bytes))
    if not is_list or len(values) > num_layers:
        shown = f"{len(values):,} entries" if is_list else repr(values)
        raise KVLibError(
            f"{name} must be a list of at most {num_layers:,} per-layer entries, not {shown}"[:200]
        )
    return tuple(values)
