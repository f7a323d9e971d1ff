"""Tests of kvlib.chapters.ch05_levers."""
