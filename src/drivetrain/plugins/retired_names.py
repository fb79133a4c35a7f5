"""Lightning 1.x's plugin class names, answered with their history and today's spelling.

``from pytorch_lightning.plugins import DDPPlugin`` becomes, with the import changed,
``from drivetrain.plugins import DDPPlugin``; each old name here gets an ``ImportError`` that says
what it was and what to import instead. The names that are pure renames of a class with the same
role and constructor (``TrainingTypePlugin``, ``PrecisionPlugin``) also exist as warned aliases in
:mod:`drivetrain.lightning_names`.
"""

from __future__ import annotations

RETIRED_PLUGIN_CLASSES: dict[str, str] = {
    "DDPPlugin": (
        "DDPPlugin is Lightning 1.5's name of DDPStrategy (training-type plugins became strategies in Lightning 1.6). "
        "Write `from drivetrain.strategies import DDPStrategy` and subclass it; its configure_ddp() must leave the "
        "wrapped module in self.model (Lightning 1.5's DDPPlugin put it in self._model, which nothing reads now)."
    ),
    "TrainingTypePlugin": (
        "TrainingTypePlugin is Lightning 1.5's name of the strategy base class (training-type plugins became "
        "strategies in Lightning 1.6). Write `from drivetrain.strategies import Strategy` (or ParallelStrategy, "
        "SingleDeviceStrategy), or keep the name with `from drivetrain.lightning_names import TrainingTypePlugin`."
    ),
    "NativeMixedPrecisionPlugin": (
        "NativeMixedPrecisionPlugin(precision, device) is Lightning 1.x's automatic mixed precision plugin (later "
        "MixedPrecisionPlugin, now MixedPrecision), whose precision was 16 or 'bf16'. Write precision='16-mixed' "
        "(or 'bf16-mixed') to the Trainer or Accelerator, or `from drivetrain.plugins import MixedPrecision` and "
        "MixedPrecision('16-mixed', device='cuda')."
    ),
    "PrecisionPlugin": (
        "PrecisionPlugin is Lightning's former name of the precision base class. Write "
        "`from drivetrain.plugins import Precision`, or keep the name with "
        "`from drivetrain.lightning_names import PrecisionPlugin`."
    ),
}
"""Each retired class name and the ``ImportError`` message a request for it gets."""
