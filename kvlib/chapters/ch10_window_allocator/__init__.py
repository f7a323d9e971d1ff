"""Windows and hybrids in a paged allocator (chapter 10): being written."""
