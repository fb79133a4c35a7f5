"""Environment variables for a block, as ``accelerate.utils`` has them.

``patch_environment`` sets some, ``clear_environment`` empties the environment,
``purge_accelerate_environment`` undoes what a function or a test class's tests set of the
launcher variables (``ACCELERATE_*``, and drivetrain launch's ``DRIVETRAIN_*``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

#: The variables :func:`purge_accelerate_environment` restores: what ``accelerate launch``, the
#: ``Accelerator`` tooling of other libraries and ``drivetrain launch`` set for a script.
LAUNCHER_PREFIXES = ("ACCELERATE_", "DRIVETRAIN_")


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


@contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the variables as they were come back after it.

    What the block sets is dropped at its end::

        with clear_environment():
            os.environ["FOO"] = "bar"  # gone after the block
    """
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def _launcher_variables_kept() -> Iterator[None]:
    saved = {key: value for key, value in os.environ.items() if key.startswith(LAUNCHER_PREFIXES)}
    try:
        yield
    finally:
        for key in [key for key in os.environ if key.startswith(LAUNCHER_PREFIXES)]:
            if key not in saved:
                del os.environ[key]
        os.environ.update(saved)


def purge_accelerate_environment(function_or_class: T) -> T:
    """Decorator: the ``ACCELERATE_*``/``DRIVETRAIN_*`` variables are as they were after each call.

    On a function, after every call; on a class, after each of its ``test*`` methods (those of
    its subclasses too), as Accelerate's decorator for test cases does. A variable the call
    removed comes back as well.
    """
    if not isinstance(function_or_class, type):
        if not callable(function_or_class):
            raise TypeError(
                f"purge_accelerate_environment decorates a function or a class, got {type(function_or_class).__name__}."
            )
        return _purging(function_or_class)  # type: ignore[return-value]
    cls: type = function_or_class
    _purge_tests_of(cls)
    previous = cls.__dict__.get("__init_subclass__")

    def init_subclass(subclass: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__get__(None, subclass)(**kwargs)
        else:
            super(cls, subclass).__init_subclass__(**kwargs)  # type: ignore[arg-type]
        _purge_tests_of(subclass)

    cls.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    return cls  # type: ignore[return-value]


def _purging(function: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(function, "_drivetrain_purges_environment", False):
        return function

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _launcher_variables_kept():
            return function(*args, **kwargs)

    wrapper._drivetrain_purges_environment = True  # type: ignore[attr-defined]
    return wrapper


def _purge_tests_of(cls: type) -> None:
    for name, value in list(vars(cls).items()):
        if name.startswith("test") and callable(value):
            setattr(cls, name, _purging(value))
