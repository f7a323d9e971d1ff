"""Tests of chapter 11's code (kvlib/chapters/ch11_radix_routing/)."""
