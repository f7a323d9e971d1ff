"""Tests of kvlib.chapters.ch06_troubleshooting."""
