"""Tests of chapter 10's code (kvlib/chapters/ch10_window_allocator/)."""
