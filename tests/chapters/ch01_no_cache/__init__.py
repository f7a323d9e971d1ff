"""Tests of kvlib.chapters.ch01_no_cache."""
