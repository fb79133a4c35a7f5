"""Lightning's spellings of drivetrain's classes, for programs moving from PyTorch Lightning.

Each name here *is* the drivetrain class (not a subclass or a copy), so ``isinstance`` checks,
type checkers and error messages see one class under two names::

    from drivetrain.lightning_names import LightningCLI, LightningDataModule, LightningModule

| Lightning's name | drivetrain's class |
|---|---|
| ``LightningModule`` | ``drivetrain.TrainingModule`` |
| ``LightningDataModule`` | ``drivetrain.DataModule`` |
| ``LightningCLI`` | ``drivetrain.cli.CLI`` (needs the ``cli`` extra) |
| ``LightningArgumentParser`` | ``drivetrain.cli.CLIArgumentParser`` (needs the ``cli`` extra) |

Names Lightning and drivetrain share (``Trainer``, ``seed_everything``, the callbacks and
loggers) are not repeated here: import them from ``drivetrain`` and its packages. New code
should use drivetrain's own names; these exist so that a migrated program changes its imports
and nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - what type checkers see for the lazy names
    from drivetrain.cli.training import CLI as LightningCLI
    from drivetrain.cli.training_parser import CLIArgumentParser as LightningArgumentParser
    from drivetrain.trainer.datamodule import DataModule as LightningDataModule
    from drivetrain.trainer.module import TrainingModule as LightningModule

__all__ = ["LightningArgumentParser", "LightningCLI", "LightningDataModule", "LightningModule"]

#: Lightning's name -> (module, drivetrain's name); imported on first use, like ``drivetrain``'s names.
_ALIASES = {
    "LightningModule": ("drivetrain.trainer.module", "TrainingModule"),
    "LightningDataModule": ("drivetrain.trainer.datamodule", "DataModule"),
    "LightningCLI": ("drivetrain.cli.training", "CLI"),
    "LightningArgumentParser": ("drivetrain.cli.training_parser", "CLIArgumentParser"),
}


def __getattr__(name: str) -> Any:
    if name not in _ALIASES:
        raise AttributeError(f"module 'drivetrain.lightning_names' has no attribute {name!r}")
    module, target = _ALIASES[name]
    if module == "drivetrain.cli.training_parser":
        importlib.import_module("drivetrain.cli.training")  # names the extra when jsonargparse is missing
    value = getattr(importlib.import_module(module), target)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
