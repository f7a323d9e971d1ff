"""PagedAttention (chapter 3): the paged kernel's cost, the memory reservation wastes, and the exercises (a
block manager with copy-on-write among them).
"""
