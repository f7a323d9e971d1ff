"""The bench section of this chapter: being written."""


def bench() -> dict:
    """Numeric fields of this chapter's bench (being written)."""
    return {}
