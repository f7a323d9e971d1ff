"""Exercises of chapter 12 (an offload tier, and swapping priced as engines copy): being written."""

from __future__ import annotations

WRONG_ANSWERS: dict = {}
FIRST_HINTS: dict = {}
EXERCISES: dict = {}
