"""Package attributes imported on first use, so importing a package does not import all of it.

A package lists its public names and the modules that define them, and installs the two
functions :func:`lazy_exports` returns as its module-level ``__getattr__`` and ``__dir__``. Type
checkers do not run ``__getattr__``: the package also imports the names under ``TYPE_CHECKING``
(``tests/test_public_types.py`` checks that each one is then its real class).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``; module ``exports[name]`` defines each name.

    A value ``"module:attribute"`` exports an attribute under another name (an alias).

    Example:
        >>> __getattr__, __dir__ = lazy_exports(__name__, {"Trainer": "drivetrain.trainer.trainer"})  # doctest: +SKIP
    """

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where.partition(":")
        value = getattr(importlib.import_module(module), attribute or name)
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
