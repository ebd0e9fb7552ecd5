"""Shape arithmetic shared by every place that pads to repeatable widths: micro-batches, prefills, the
cross-scorer's forwards and the decode graphs' length buckets."""

from __future__ import annotations


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `value` (`multiple` >= 1)."""
    return -(-value // multiple) * multiple
