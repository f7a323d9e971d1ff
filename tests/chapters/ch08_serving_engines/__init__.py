"""Tests of kvlib.chapters.ch08_serving_engines."""
