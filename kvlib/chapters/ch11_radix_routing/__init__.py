"""Chapter 11: a radix prefix tree beside the hash prefix cache, and cache-aware routing."""
