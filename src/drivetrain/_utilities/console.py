"""Writing to the terminal without breaking a progress bar.

A tqdm bar redraws its line in place; a plain write while it is on screen leaves a broken bar
line behind. :func:`write` clears the bars that share the terminal, writes, and redraws them
(tqdm's ``external_write_mode``) — when tqdm was never imported no bar can be on screen and the
text is written directly.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def write(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` (add the newline yourself) to ``stream`` (stderr by default), above any progress bar."""
    stream = stream if stream is not None else sys.stderr
    tqdm_module = sys.modules.get("tqdm")
    if tqdm_module is None:
        stream.write(text)
        stream.flush()
        return
    with tqdm_module.tqdm.external_write_mode(file=stream):
        stream.write(text)
        stream.flush()


def print_line(
    *values: Any, sep: str = " ", end: str = "\n", file: TextIO | None = None, flush: bool = True
) -> None:
    """``print``'s signature, written with :func:`write` (to stdout by default)."""
    write(sep.join(map(str, values)) + end, file if file is not None else sys.stdout)
