"""Exercises of chapter 11 (a radix prefix tree, and routing by prefix): being written."""

from __future__ import annotations

WRONG_ANSWERS: dict = {}
FIRST_HINTS: dict = {}
EXERCISES: dict = {}
