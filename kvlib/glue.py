"""The values a chapter's prose quotes from this run, handed to the page (every chapter).

A sentence of the book never types a result: it pastes it with myst-nb's
``{glue:text}`key:.2f``` role, from the notebook cell that computed it, so that the prose and the
outputs beside it cannot disagree on any machine. :func:`glue` stores the values without showing
them (the cell's visible output stays what it printed) and turns numpy scalars into plain Python
numbers, whose text myst-nb can format (``np.float64(1.5)`` it cannot).

A verdict in words ("never", "reaches") is glued as text in both languages: ``glue(needed=...,
needed_ja=...)``; the Japanese catalogue pastes ``needed_ja`` where the English pastes ``needed``
(``kvbook_sphinx.i18n`` allows exactly that swap). tests/test_prose_numbers.py checks that every
key the prose pastes is glued by its notebook.
"""

from __future__ import annotations

import math
import numbers

from kvlib import KVLibError


def plain(value):
    """``value`` as a plain Python bool, int, float or str (numpy scalars included)."""
    if isinstance(value, bool | str):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a numpy or torch scalar
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise KVLibError(f"glue: a glued number must be finite, not {value!r}")
        return float(value)
    raise KVLibError(f"glue: a glued value must be a number, a bool or a str, not {type(value).__name__}")


def glue(**values) -> None:
    """Glue each ``name=value`` into the notebook for the prose, not shown in the cell's output.

    Outside a notebook kernel (a test, a script) the values are only checked. Returns nothing, so
    that a cell ending with it shows nothing more.
    """
    plain_values = {name: plain(value) for name, value in values.items()}
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the book's pins
        return
    if get_ipython() is None:
        return
    from myst_nb import glue as myst_glue

    for name, value in plain_values.items():
        myst_glue(name, value, display=False)


def glue_exact(**values) -> None:
    """:func:`glue` for a cell whose output nbval compares: values that are the same on every machine
    (simulated on a seeded trace, modelled from a data sheet), floats rounded to 12 significant digits,
    since nbval compares their text and the last bits of a float sum are not the point (chapter 4)."""
    glue(**{key: float(f"{v:.12g}") if isinstance(v, float) else v for key, v in values.items()})
