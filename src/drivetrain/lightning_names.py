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

Lightning 1.x's plugin names: ``TrainingTypePlugin`` (now ``drivetrain.strategies.Strategy``) and
``PrecisionPlugin`` (now ``drivetrain.plugins.Precision``) are aliases that warn when imported;
``DDPPlugin`` and ``NativeMixedPrecisionPlugin``, whose contracts changed, are an ``ImportError``
that writes the modern spelling (docs/migrating-from-lightning.md lists each).

Names Lightning and drivetrain share (``Trainer``, ``seed_everything``, the callbacks and
loggers) are not repeated here: import them from ``drivetrain`` and its packages. New code
should use drivetrain's own names; these exist so that a migrated program changes its imports
and nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.retired import warn_renamed

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


#: Lightning 1.x's names of classes that kept their role and constructor: (module, public name, history).
_WARNED_ALIASES = {
    "TrainingTypePlugin": (
        "drivetrain.strategies.strategy",
        "drivetrain.strategies.Strategy",
        "Lightning 1.5's name of the strategy base class (training-type plugins became strategies in 1.6)",
    ),
    "PrecisionPlugin": (
        "drivetrain.plugins.precision.precision",
        "drivetrain.plugins.Precision",
        "Lightning's former name of the precision base class",
    ),
}


def __getattr__(name: str) -> Any:
    if name in _WARNED_ALIASES:
        module, public, history = _WARNED_ALIASES[name]
        warn_renamed(name, public, history)
        return getattr(
            importlib.import_module(module), public.rsplit(".", 1)[1]
        )  # not cached: every use warns
    if name not in _ALIASES:
        from drivetrain.plugins.retired_names import RETIRED_PLUGIN_CLASSES

        if name in RETIRED_PLUGIN_CLASSES:
            raise ImportError(RETIRED_PLUGIN_CLASSES[name], name=name)
        raise AttributeError(f"module 'drivetrain.lightning_names' has no attribute {name!r}")
    module, target = _ALIASES[name]
    if module == "drivetrain.cli.training_parser":
        importlib.import_module("drivetrain.cli.training")  # names the extra when jsonargparse is missing
    value = getattr(importlib.import_module(module), target)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
