"""Tests of chapter 12's code (kvlib/chapters/ch12_offload_tier/)."""
