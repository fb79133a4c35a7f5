"""Start writing a file to disk while it is still being written, so the final ``fsync`` waits for little.

A crash-safe checkpoint write ends with ``fsync``: the checkpoint counts as saved only once its
bytes are on disk. Left alone, the kernel keeps everything in the page cache until then, and the
whole file goes to disk after serialisation has finished. :func:`write_behind` wraps the open
file so that every :data:`CHUNK` bytes it asks the kernel to start writing the pages written so
far (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait): the disk works while
``torch.save`` produces the rest. It changes when data reaches the disk, never whether: the
``fsync`` at the end still decides. Where ``sync_file_range`` does not exist it returns the file
unchanged.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import IO, Any

#: Bytes written between two requests to start write-back.
CHUNK = 8 * 2**20
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


class _WriteBehind:
    """A binary file whose written pages start going to disk every :data:`CHUNK` bytes."""

    def __init__(self, file: IO[bytes], start: Callable[[int, int, int, int], int]) -> None:
        self._file = file
        self._start = start
        self._fd = file.fileno()
        self._pending = 0

    def write(self, data: Any) -> int:
        written = self._file.write(data)
        self._pending += written
        if self._pending >= CHUNK:
            self._pending = 0
            self._file.flush()
            # Offset 0, length 0: every dirty page of the file not already on its way. A failure
            # (an odd file system) only loses the head start; the final fsync reports real errors.
            self._start(self._fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def write_behind(file: IO[bytes]) -> IO[bytes]:
    """``file`` (open for writing, on a local disk) with write-back started as it grows; see the module doc."""
    start = _sync_file_range()
    if start is None:
        return file
    return _WriteBehind(file, start)  # type: ignore[return-value]
