"""Serving as engines do it now (chapter 8): chunked prefill, swapping against recomputation, speculative
decoding's bench, prefix caching predicted and simulated, the cache over many GPUs, the vLLM flag map.
"""
