"""MLA in depth: decoding with the weights absorbed (chapter 9): being written."""
