"""Tests of kvlib.train (chapter 7: the corpus, the trainer, the shipped weights)."""
