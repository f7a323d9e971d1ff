"""Tests of kvlib.chapters.ch03_paged_attention."""
