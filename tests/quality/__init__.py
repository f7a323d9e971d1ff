"""Tests of kvlib.quality (chapter 7: perplexity, recall and agreement through each lever)."""
