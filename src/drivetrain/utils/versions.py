"""Version checks as ``accelerate.utils`` spells them: ``is_torch_version(">=", "2.4")``, ``compare_versions``."""

from __future__ import annotations

import importlib.metadata
import operator
from collections.abc import Callable
from typing import Any

from torch.torch_version import TorchVersion  # packaging's version ordering, without depending on packaging

_OPERATIONS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}


def compare_versions(library_or_version: str, operation: str, requirement_version: str) -> bool:
    """Whether the installed version of a package (by name), or a version string, ``operation`` ``requirement_version``.

    Example:
        >>> compare_versions("2.4.0", ">=", "2.1")
        True

    Raises:
        ValueError: an ``operation`` other than ``>``, ``>=``, ``==``, ``!=``, ``<=``, ``<``.
        importlib.metadata.PackageNotFoundError: a package name that is not installed.
    """
    if operation not in _OPERATIONS:
        raise ValueError(f"operation={operation!r} is not a comparison; use one of {', '.join(_OPERATIONS)}.")
    version = str(library_or_version)
    if not version[:1].isdigit():
        version = importlib.metadata.version(version)
    return _OPERATIONS[operation](TorchVersion(version), requirement_version)


def is_torch_version(operation: str, version: str) -> bool:
    """Whether the installed torch's version ``operation`` ``version`` (``is_torch_version(">=", "2.4")``)."""
    return compare_versions("torch", operation, version)
