"""Tests of kvlib.kernels: every decode kernel against the PyTorch reference, and the dispatch."""
