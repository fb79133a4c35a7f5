"""Command-line entry points: ``drivetrain launch``, ``drivetrain env`` and the training-script ``CLI``.

``CLI`` (``python train.py fit --trainer.devices=2``) needs the ``cli`` extra (jsonargparse); it is
imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy name
    from drivetrain.cli.training import CLI

__all__ = ["CLI"]


def __getattr__(name: str) -> Any:
    if name == "CLI":
        value = importlib.import_module("drivetrain.cli.training").CLI
        globals()[name] = value
        return value
    raise AttributeError(f"module 'drivetrain.cli' has no attribute {name!r}")
