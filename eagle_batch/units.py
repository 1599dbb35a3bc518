"""Sizes as people read them: `human_bytes(652_000) == "652 kB"`, never "0.0 GB" for a small figure."""

from __future__ import annotations

# Decimal units, as `df -H` and disk vendors count: the figures are compared with a filesystem's free space.
_UNITS = ("kB", "MB", "GB", "TB", "PB")


def human_bytes(n: float) -> str:
    """`n` bytes with three significant digits in the largest unit that keeps the number >= 1:
    512 -> "512 bytes", 1_900_000 -> "1.90 MB", 4_600_000_000 -> "4.60 GB"."""
    n = float(n)
    if abs(n) < 1000:
        return f"{n:.0f} bytes"
    for unit in _UNITS:
        n /= 1000
        if abs(n) < 1000 or unit == _UNITS[-1]:
            break
    digits = 2 if abs(n) < 10 else 1 if abs(n) < 100 else 0
    return f"{n:.{digits}f} {unit}"
