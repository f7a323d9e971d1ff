"""Browser tests: the built book in headless Chromium (pages, widgets, the online calculator)."""
