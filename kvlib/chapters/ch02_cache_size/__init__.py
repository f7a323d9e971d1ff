"""How big the cache is (chapter 2): the size formula against real caches, and decode attention's speed for
each number of KV heads on its roofline.
"""
