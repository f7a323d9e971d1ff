"""Small matplotlib helpers so that every chapter's figures look alike.

Chapter-specific drawings live here too, one function per figure, each naming its chapter.
"""

from __future__ import annotations

import matplotlib.pyplot as plt


def axes(title: str, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False, size=(6.4, 3.8)):
    """A new figure with one labelled axes (grid on, log scales as asked); returns (fig, ax)."""
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax
