"""Progress as whole lines of text, for output that is not a terminal (a log file, a pipe).

A terminal bar redraws its line with carriage returns; written to a file, every redraw stays,
and a long run's log becomes thousands of fragments. The built-in progress bars switch to
:class:`PlainProgress` when their stream is not a terminal.
"""

from __future__ import annotations

import math
import time
from typing import Any


class PlainProgress:
    """One stage's progress as whole lines, for output that is not a terminal.

    A line when the stage ends (:meth:`close`) and, while it runs, at most one every ``interval``
    seconds; counting a batch costs an addition and a clock read. ``write`` receives each line.
    """

    def __init__(self, description: str, total: float, write: Any, interval: float) -> None:
        self.description = description
        self.total = total
        self.write = write
        self.interval = interval
        self.done = 0
        self.start = time.monotonic()
        self.next_line = self.start + interval

    @property
    def n(self) -> int:
        """Batches counted so far (tqdm's name, for code that reads a bar's position)."""
        return self.done

    def advance(self, postfix: Any = None) -> None:
        self.done += 1
        now = time.monotonic()
        if now >= self.next_line:
            self.line(postfix, now)

    def draw(self, postfix: Any = None, now: float | None = None) -> None:
        """Nothing between lines: a log gets no redraws."""

    def line(self, postfix: Any = None, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.next_line = now + self.interval
        metrics = postfix() if callable(postfix) else postfix
        self.write(progress_line(self.description, self.done, self.total, now - self.start, metrics) + "\n")

    def close(self, postfix: Any = None) -> None:
        self.line(postfix)

    def discard(self) -> None:
        """Nothing to clear."""


def progress_line(
    description: str, done: int, total: float, elapsed: float, metrics: dict[str, Any] | None = None
) -> str:
    """``Epoch 0: 50% 4/8 [00:02<00:02, 2.00it/s] train_loss=0.123``: a bar's state as one line of text."""
    rate = done / elapsed if elapsed > 0 else 0.0
    if total and not math.isinf(total):
        left = (total - done) / rate if rate > 0 else 0.0
        text = (
            f"{description}: {100 * done / total:.0f}% {done}/{int(total)} "
            f"[{clock(elapsed)}<{clock(left)}, {rate:.2f}it/s]"
        )
    else:
        text = f"{description}: {done} [{clock(elapsed)}, {rate:.2f}it/s]"
    if metrics:
        text += " " + " ".join(f"{name}={short(value)}" for name, value in metrics.items())
    return text


def clock(seconds: float) -> str:
    """``MM:SS``, or ``H:MM:SS`` from an hour on."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` can redraw a bar in place: a terminal, or a notebook's output (Jupyter
    renders carriage returns, although its streams are not terminals)."""
    if type(stream).__module__.startswith("ipykernel"):
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def short(value: Any) -> str:
    """A metric as the bars show it (floats to 4 significant digits)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
