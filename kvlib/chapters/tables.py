"""How the chapters show their tables: whole, every column and every cell (each chapter's first cell).

pandas cuts wide tables and long strings to fit a terminal; a book's tables must show what they
hold. The chapters call :func:`show_whole_tables` once, explicitly: importing kvlib changes nothing.
"""

from __future__ import annotations


def show_whole_tables() -> None:
    """Let pandas print every column and whole strings, on a line as wide as a page's tables."""
    import pandas

    pandas.set_option("display.max_columns", None)
    pandas.set_option("display.max_colwidth", None)
    pandas.set_option("display.width", 250)
