"""Parsing and formatting of byte sizes, counts, rates and durations."""

from __future__ import annotations

import re
from fractions import Fraction

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
#: The largest size: the engines count bytes in signed 64-bit integers.
SIZE_MAX = (1 << 63) - 1


def parse_size(text: str | int, expected: str = "a size like 512M or 2G") -> int:
    """Bytes in a size such as ``2G``, ``512M``, ``1.5GiB`` or ``4096`` (K/M/G are binary), at
    most :data:`SIZE_MAX`; ``expected`` says what else the caller accepts, for the error."""
    if isinstance(text, bool):
        raise ValueError(f"expected {expected}, got {text!r}")
    if isinstance(text, int):
        number = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise ValueError(f"expected {expected}, got {text!r}")
        digits, unit, _ = m.groups()
        # Exact arithmetic: a float would round a large byte count, or overflow.
        number = int(Fraction(digits) * 1024 ** _POWERS[unit.lower()])
    if number < 0:
        raise ValueError(f"a size cannot be negative, got {text}")
    if number > SIZE_MAX:
        raise ValueError(f"a size must be at most {SIZE_MAX} bytes (8 EiB), got {text!r}")
    return number


#: The longest deadline, in seconds (31 years): gRPC counts a deadline in signed 64-bit
#: nanoseconds from now, and one past about 9.2e9 s wraps into the past.
MAX_SECONDS = 10**9


def check_seconds(value: object, zero: bool = False) -> float:
    """``value`` as a deadline in seconds: a positive number up to :data:`MAX_SECONDS` (gRPC
    takes 0, a negative number, infinity or a wrapped deadline as one already missed), or with
    ``zero`` also 0 (a wait)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and (0 <= value if zero else 0 < value) and value <= MAX_SECONDS):
        what = "a finite number of seconds, 0 or more" if zero else "a finite positive number of seconds"
        raise ValueError(f"must be {what} (at most {MAX_SECONDS:.0e}), got {value!r}")
    return float(value)


def fmt_bytes(n: float) -> str:
    """``1.50 GiB``, ``512 MiB``, ``731 B``."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, u = float(n), 0
    while v >= 1024 and u + 1 < len(units):
        v /= 1024
        u += 1
    if u == 0:
        return f"{int(n)} B"
    return f"{v:.0f} {units[u]}" if v >= 100 else f"{v:.1f} {units[u]}" if v >= 10 else f"{v:.2f} {units[u]}"


def fmt_count(n: float) -> str:
    """``950``, ``12.3k``, ``4.56M``, ``1.20G`` (decimal)."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            v = n / div
            return f"{v:.0f}{suffix}" if v >= 100 else f"{v:.1f}{suffix}" if v >= 10 else f"{v:.2f}{suffix}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def fmt_rate_mb(bytes_: float, seconds: float) -> str:
    """Throughput in decimal MB/s."""
    return f"{bytes_ / max(seconds, 1e-9) / 1e6:.1f} MB/s"


def fmt_duration(seconds: float) -> str:
    """``0.42 s``, ``12.3 s``, ``4:05``, ``1:02:03``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
