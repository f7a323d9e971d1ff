"""Serving under a memory budget (chapter 4): the placement policies compared, the rate each sustains at
equal latency, what sharing blocks saves, and the exercises.
"""
