"""How to read the measurements (chapter 0): its exercises and its bench section."""
