"""A shopping cart's total."""

from prices import with_tax


def total(lines: list[tuple[int, str, int]]) -> int:
    """The total in cents of (price in cents, kind, quantity) lines, each line's price taxed."""
    return sum(with_tax(cents, kind) for cents, kind, quantity in lines)
