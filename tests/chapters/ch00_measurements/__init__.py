"""Tests of kvlib.chapters.ch00_measurements."""
