"""Tests of kvlib.paged, one file per module."""
