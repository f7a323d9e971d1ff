"""Tests of kvlib.measure, one file per module."""
