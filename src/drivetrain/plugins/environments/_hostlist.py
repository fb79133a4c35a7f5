"""Parsing SLURM's compressed host lists and per-node task counts.

SLURM writes ``SLURM_JOB_NODELIST`` as a *hostlist expression* and ``SLURM_TASKS_PER_NODE`` as a
run-length encoded list; these helpers expand both without calling ``scontrol``, which is not
available inside every container a job runs in.

The grammar follows SLURM's own parser: hosts are separated by commas, spaces or tabs (empty
entries are skipped), a bracket holds comma-separated numbers and ranges whose zero padding is
kept, and several bracket groups in one host multiply out. Whitespace around the numbers inside
a bracket is ignored (``"1.2.3.[089, 100-110]"``); SLURM does not write it, but people do.

Why not the ``python-hostlist`` package: it is GPL-licensed (drivetrain is Apache-2.0), it takes
spaces as part of a host name (``"a b"`` is one host, ``"1.2.3.[089, 100-110]"`` an error) and
drops repeated hosts; the tests use it as an oracle for the expressions both accept.
"""

from __future__ import annotations

import itertools
import re

_COUNT_PATTERN = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


_SEPARATORS = frozenset(", \t\n")


def _split_top_level(text: str, expression: str) -> list[str]:
    """Split ``text`` at separators that are not inside brackets, skipping empty entries."""
    parts: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"Nested brackets in the host list {expression!r} are not valid.")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"Unbalanced ']' in the host list {expression!r}.")
        elif char in _SEPARATORS and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth != 0:
        raise ValueError(f"Unclosed '[' in the host list {expression!r}.")
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_range_set(body: str, expression: str) -> list[str]:
    """Expand the inside of one bracket, e.g. ``"001-003,007"``, keeping zero padding."""
    values: list[str] = []
    for piece in body.split(","):
        low, dash, high = (part.strip() for part in piece.partition("-"))
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(
                f"Invalid range {piece.strip()!r} in the host list {expression!r}; "
                "expected numbers or ranges like '1-4' or '001-012' inside brackets."
            )
        if not dash:
            values.append(low)
            continue
        start, stop = int(low), int(high)
        if stop < start:
            raise ValueError(f"Descending range {piece!r} in the host list {expression!r}.")
        # SLURM pads every number to the width of the range's first bound ("08-10" -> 08, 09, 10).
        width = len(low)
        values.extend(str(number).zfill(width) for number in range(start, stop + 1))
    return values


def _expand_item(item: str, expression: str) -> list[str]:
    """Expand one host pattern, which may hold several bracket groups (``rack[1-2]n[1-3]``)."""
    segments: list[list[str]] = []
    rest = item
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            segments.append([rest])
            break
        close_at = rest.find("]", open_at)
        if open_at > 0:
            segments.append([rest[:open_at]])
        segments.append(_expand_range_set(rest[open_at + 1 : close_at], expression))
        rest = rest[close_at + 1 :]
    return ["".join(parts) for parts in itertools.product(*segments)]


def expand_hostlist(expression: str) -> list[str]:
    """Expand a SLURM hostlist expression into host names, in order.

    Example: ``"node[001-003,007],gpu-a[1-2] login"`` gives ``node001, node002, node003,
    node007, gpu-a1, gpu-a2, login``.

    Raises:
        ValueError: The expression is empty or malformed.
    """
    items = _split_top_level(expression, expression)
    if not items:
        raise ValueError(
            f"The SLURM host list {expression!r} names no host; expected something like 'node[01-04]'."
        )
    hosts: list[str] = []
    for item in items:
        hosts.extend(_expand_item(item, expression))
    return hosts


def expand_tasks_per_node(name: str, value: str) -> list[int]:
    """Expand a SLURM task-count list such as ``"2(x3),1"`` into ``[2, 2, 2, 1]``.

    Args:
        name: The variable the value came from (for the error message).
        value: The variable's value.

    Raises:
        ValueError: The value does not follow SLURM's ``count[(xrepeat)],...`` format.
    """
    counts: list[int] = []
    for piece in value.split(","):
        match = _COUNT_PATTERN.match(piece.strip())
        if match is None:
            raise ValueError(
                f"The environment variable {name}={value!r} is not a SLURM task count list; "
                "expected something like '4' or '2(x3),1'."
            )
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        counts.extend([count] * repeat)
    return counts
