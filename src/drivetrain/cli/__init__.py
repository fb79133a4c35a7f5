"""Command-line entry points: ``drivetrain launch``, ``drivetrain env`` and the training-script ``CLI``.

``CLI`` (``python train.py fit --trainer.devices=2``) and its parts need the ``cli`` extra
(jsonargparse); they are imported on first use, so ``drivetrain --help`` stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.lazy import import_submodule, public_submodules

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names
    from drivetrain.cli.training import CLI
    from drivetrain.cli.training_parser import CLIArgumentParser, ReduceLROnPlateau, SaveConfigCallback

__all__ = ["CLI", "CLIArgumentParser", "ReduceLROnPlateau", "SaveConfigCallback"]

_LAZY = {
    "CLI": "drivetrain.cli.training",
    "CLIArgumentParser": "drivetrain.cli.training_parser",
    "ReduceLROnPlateau": "drivetrain.cli.training_parser",
    "SaveConfigCallback": "drivetrain.cli.training_parser",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        submodule = import_submodule(__name__, name)
        if submodule is not None:
            return submodule
        raise AttributeError(f"module 'drivetrain.cli' has no attribute {name!r}")
    if module == "drivetrain.cli.training_parser":
        importlib.import_module("drivetrain.cli.training")  # checks for jsonargparse, naming the extra
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | public_submodules(__name__))
