"""A radix prefix tree, and routing by prefix (chapter 11): being written."""
