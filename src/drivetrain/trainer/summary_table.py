"""Plain-text tables printed on global rank 0: evaluation results and the model summary."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(row[i], (int, float)) for row in rows) if rows else False for i in range(len(headers))
    ]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(row, widths, numeric)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def print_results(stage: str, results: list[dict[str, float]]) -> None:
    """Print each loader's metrics (one write, so concurrent ranks' output does not interleave)."""
    blocks = []
    for index, metrics in enumerate(results):
        title = f"{stage} metrics" + (f" (dataloader {index})" if len(results) > 1 else "")
        rows = [(name, value) for name, value in sorted(metrics.items())]
        blocks.append(
            f"{title}\n{format_table(['metric', 'value'], rows)}" if rows else f"{title}: nothing logged"
        )
    if blocks:
        sys.stdout.flush()
        os.write(1, ("\n\n".join(blocks) + "\n").encode())
