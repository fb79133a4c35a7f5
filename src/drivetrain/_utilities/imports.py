"""Optional dependencies: find them without importing them, and say how to install them."""

from __future__ import annotations

import importlib.util
from functools import cache


@cache
def package_available(name: str) -> bool:
    """Whether ``name`` can be imported, found without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class MissingDependencyError(ImportError):
    """An optional dependency is missing; the message names the extra that provides it."""


def require(name: str, *, extra: str, feature: str) -> None:
    """Raise :class:`MissingDependencyError` unless ``name`` is importable."""
    if not package_available(name):
        raise MissingDependencyError(
            f"{feature} needs the '{name}' package, which is not installed. "
            f"Install it with: pip install 'drivetrain[{extra}]'"
        )
