"""Tests of chapter 09's code (kvlib/chapters/ch09_mla_absorbed/)."""
