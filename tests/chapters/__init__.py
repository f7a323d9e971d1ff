"""Tests of kvlib.chapters: one folder per chapter."""
