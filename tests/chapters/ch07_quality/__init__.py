"""Tests of kvlib.chapters.ch07_quality."""
