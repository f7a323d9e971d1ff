"""Tests of kvlib.cache, one file per module."""
