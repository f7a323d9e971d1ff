"""Tests of kvlib.serving, one file per module."""
