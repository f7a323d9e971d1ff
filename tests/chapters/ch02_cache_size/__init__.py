"""Tests of kvlib.chapters.ch02_cache_size."""
