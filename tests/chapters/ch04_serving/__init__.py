"""Tests of kvlib.chapters.ch04_serving."""
