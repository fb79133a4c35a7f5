"""Package attributes imported on first use, so importing a package does not import all of it.

A package lists its public names and the modules that define them, and installs the two
functions :func:`lazy_exports` returns as its module-level ``__getattr__`` and ``__dir__``. Its
subpackages and modules are attributes too, imported on first use as well (``dt.trainer.callbacks``,
as Lightning users write ``pl.callbacks``): :func:`import_submodule`. Type
checkers do not run ``__getattr__``: the package also imports the names under ``TYPE_CHECKING``
(``tests/test_public_types.py`` checks that each one is then its real class).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


def import_submodule(package: str, name: str) -> ModuleType | None:
    """``package.name`` imported, when ``name`` is one of the package's public modules; else ``None``.

    What a package's ``__getattr__`` falls back to, so that ``import drivetrain as dt`` followed by
    ``dt.loggers.CSVLogger`` works without ``import drivetrain`` importing every subpackage.
    """
    if name.startswith("_"):
        return None  # dunder probes (``__wrapped__`` …) and private modules stay plain AttributeErrors
    import importlib.util

    try:
        spec = importlib.util.find_spec(f"{package}.{name}")
    except (ImportError, ValueError):
        return None
    return importlib.import_module(spec.name) if spec is not None else None


def public_submodules(package: str) -> set[str]:
    """The names of ``package``'s public modules and subpackages (for ``dir()``), without importing them."""
    import pkgutil

    paths = getattr(sys.modules[package], "__path__", None) or []
    return {info.name for info in pkgutil.iter_modules(paths) if not info.name.startswith("_")}


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
            submodule = import_submodule(package, name)
            if submodule is not None:
                return submodule
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where.partition(":")
        value = getattr(importlib.import_module(module), attribute or name)
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports) | public_submodules(package))

    return __getattr__, __dir__
