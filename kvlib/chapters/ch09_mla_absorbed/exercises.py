"""Exercises of chapter 9 (MLA in depth: decoding with the weights absorbed): being written."""

from __future__ import annotations

WRONG_ANSWERS: dict = {}
FIRST_HINTS: dict = {}
EXERCISES: dict = {}
