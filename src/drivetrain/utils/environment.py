"""``patch_environment``: environment variables set for a block (as ``accelerate.utils``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables for the block (names upper-cased, values as ``str``); restore them after.

    >>> with patch_environment(master_port=29501):  # doctest: +SKIP
    ...     ...
    """
    saved: dict[str, str | None] = {}
    for name, value in kwargs.items():
        key = name.upper()
        saved.setdefault(key, os.environ.get(key))
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, previous in saved.items():
            if previous is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = previous
