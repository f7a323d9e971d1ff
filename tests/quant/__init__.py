"""Tests of kvlib.quant: the quantizers and formats of the quality chapter."""
