"""An offload tier for the cache, and swapping priced as engines copy (chapter 12): being written."""
