"""Tests of kvlib.model, one file per module."""
