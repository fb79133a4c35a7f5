"""Names Lightning retired, answered with their history and today's spelling.

Two tools, used where users meet the old names:

* :func:`refuse_retired_arguments` decorates a constructor so that a keyword argument Lightning
  removed (``Trainer(gpus=4)``) is a ``TypeError`` that says what it was and writes the modern
  call, instead of Python's "unexpected keyword argument". Only the constructor call pays for it.
* :func:`warn_renamed` is the warning an old name that still works (an alias) gives when used.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

#: Explains one retired keyword argument: (the class's name, every keyword argument given) -> message.
Explanation = Callable[[str, Mapping[str, Any]], str]


def refuse_retired_arguments(
    retired: Mapping[str, Explanation],
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate ``__init__``: a keyword argument named in ``retired`` raises ``TypeError`` with its explanation.

    The decorated constructor keeps its signature (``inspect.signature`` and type checkers see
    the original), so the retired names stay out of it.
    """

    def decorate(init: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(init)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            for name in kwargs:
                if name in retired:
                    owner = type(args[0]).__name__ if args else init.__qualname__.split(".")[0]
                    raise TypeError(retired[name](owner, kwargs))
            return init(*args, **kwargs)

        return checked

    return decorate


class RenamedWarning(FutureWarning):
    """An old (Lightning) name that still works was used; the message gives the name to use instead."""


def warn_renamed(old: str, new: str, history: str) -> None:
    """Warn that ``old`` is an alias of ``new``, kept for programs written for an older Lightning.

    The warning points at the first caller outside drivetrain: the user's line that used the old name.
    """
    warnings.warn(
        f"{old} is {history}; it still works here as an alias of {new}, but will be removed: use {new}.",
        RenamedWarning,
        stacklevel=_first_frame_outside_drivetrain(),
    )


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _first_frame_outside_drivetrain() -> int:
    frame, level = sys._getframe(2), 2  # 1 is warn_renamed itself
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level
