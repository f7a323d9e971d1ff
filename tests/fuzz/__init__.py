"""Property tests over the arguments of kvlib's public library functions (hypothesis)."""
