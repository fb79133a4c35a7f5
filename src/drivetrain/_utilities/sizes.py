"""Memory sizes written as users write them: ``123``, ``"10MB"``, ``"1.5GiB"``."""

from __future__ import annotations

import re

_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def parse_size(size: int | str, argument: str | None = None) -> int:
    """Bytes in ``size`` (an int >= 0, or a number with a unit: decimal KB/MB/GB/TB, binary KiB/MiB/GiB).

    Raises:
        ValueError: not a size; ``argument`` (if given) names it in the message.
    """
    if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", str(size).upper())
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(
            f"{f'{argument}=' if argument else ''}{size!r} is not a {'size' if argument else 'memory size'}; "
            "give bytes (an int) or a string such as '10MB' or '2GiB'."
        )
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def format_size(size: int) -> str:
    """``size`` bytes for people: ``"512 B"``, ``"3.8 MB"``, ``"1.2 GB"`` (decimal units)."""
    for unit, factor in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"
