"""Tests of kvlib.sizing, one file per module."""
