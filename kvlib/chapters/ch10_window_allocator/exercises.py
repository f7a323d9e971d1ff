"""Exercises of chapter 10 (Windows and hybrids in a paged allocator): being written."""

from __future__ import annotations

WRONG_ANSWERS: dict = {}
FIRST_HINTS: dict = {}
EXERCISES: dict = {}
