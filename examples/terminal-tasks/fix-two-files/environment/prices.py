"""Prices in cents, and the tax on them."""

TAX_PERCENT = {"food": 10, "books": 0, "other": 25}


def with_tax(cents: int, kind: str) -> int:
    """The price with its tax, rounded to the nearest cent (halves up)."""
    return cents * (100 + TAX_PERCENT[kind]) // 100
