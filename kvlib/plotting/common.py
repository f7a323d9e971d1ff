"""The axes every figure of the book starts from, so that all chapters' figures look alike.

:func:`axes` makes a new figure with one labelled axes, a light grid and, where asked, log
scales whose ticks read as plain numbers (0.5, 16, 1,000) rather than powers of ten. Every
``draw_*`` function of :mod:`kvlib.plotting` (chapters 1 to 5) that draws a single panel
starts from it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker


@matplotlib.ticker.FuncFormatter
def _plain(value, _pos=None) -> str:
    """Log-axis ticks as plain numbers (0.5, 16, 1,000), not powers of ten."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def axes(title: str, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False, size=(6.4, 3.8)):
    """A new figure with one labelled axes (grid on, log scales as asked); returns (fig, ax)."""
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_plain)
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_plain)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax
