"""drivetrain: one PyTorch training program on any hardware, distribution scheme, precision and cluster.

Everything here is imported lazily so that ``import drivetrain`` costs next to nothing beyond
``import torch``; the first use of a name imports the module that defines it.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The process that started this one, read as early as drivetrain runs (and again in a forked
# child). A rank asks for its launcher when it sets up, seconds later; a launcher killed in between
# has by then been replaced as the parent by init, and the orphan would take init for its launcher.
_started_by = [os.getppid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _started_by.__setitem__(0, os.getppid()))

_LAZY = {
    "connect": "drivetrain.connector",
    "seed_everything": "drivetrain._utilities.seed",
    "Accelerator": "drivetrain.facade",
    "AcceleratorState": "drivetrain.facade",
    "PartialState": "drivetrain.facade",
    "SeedableRandomSampler": "drivetrain.data.seeding",
    "ParallelLayout": "drivetrain.strategies.layout",
    "ParallelismConfig": "drivetrain.strategies.layout",
    "find_executable_batch_size": "drivetrain.utils.memory",
    "debug_launcher": "drivetrain.facade.notebook",
    "notebook_launcher": "drivetrain.facade.notebook",
    "skip_first_batches": "drivetrain.data.prepare",
    "Trainer": "drivetrain.trainer",
    "TrainingModule": "drivetrain.trainer",
    "DataModule": "drivetrain.trainer",
    "Tuner": "drivetrain.trainer.tuner",
    "LearningRateFinder": "drivetrain.trainer.callbacks",
    "BatchSizeFinder": "drivetrain.trainer.callbacks",
    "BackboneFinetuning": "drivetrain.trainer.callbacks",
    "BaseFinetuning": "drivetrain.trainer.callbacks",
    "EMAWeightAveraging": "drivetrain.trainer.callbacks",
    "ModelPruning": "drivetrain.trainer.callbacks",
    "StochasticWeightAveraging": "drivetrain.trainer.callbacks",
    "WeightAveraging": "drivetrain.trainer.callbacks",
    # Accelerate's big-model helpers, at the top level as in ``accelerate``.
    "init_empty_weights": "drivetrain.big_modeling",
    "init_on_device": "drivetrain.big_modeling",
    "cpu_offload": "drivetrain.big_modeling",
    "disk_offload": "drivetrain.big_modeling",
    "dispatch_model": "drivetrain.big_modeling",
    "load_checkpoint_and_dispatch": "drivetrain.big_modeling",
    # The Trainer's built-in callbacks (also in drivetrain.trainer.callbacks).
    "BasePredictionWriter": "drivetrain.trainer.callbacks",
    "DeviceStatsMonitor": "drivetrain.trainer.callbacks",
    "GradientAccumulationScheduler": "drivetrain.trainer.callbacks",
    "LambdaCallback": "drivetrain.trainer.callbacks",
    "RichModelSummary": "drivetrain.trainer.callbacks",
    "RichProgressBar": "drivetrain.trainer.callbacks",
    "SpikeDetection": "drivetrain.trainer.callbacks",
    "Timer": "drivetrain.trainer.callbacks",
}

__all__ = [
    "Accelerator",
    "AcceleratorState",
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "DataModule",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "ModelPruning",
    "ParallelLayout",
    "ParallelismConfig",
    "PartialState",
    "RichModelSummary",
    "RichProgressBar",
    "SeedableRandomSampler",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "Timer",
    "Trainer",
    "TrainingModule",
    "Tuner",
    "WeightAveraging",
    "__version__",
    "connect",
    "cpu_offload",
    "debug_launcher",
    "disk_offload",
    "dispatch_model",
    "find_executable_batch_size",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "notebook_launcher",
    "seed_everything",
    "skip_first_batches",
]

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names above
    # The subpackages are attributes too (``dt.trainer.callbacks.ModelCheckpoint``), imported on first use.
    from drivetrain import accelerators as accelerators
    from drivetrain import big_modeling as big_modeling
    from drivetrain import cli as cli
    from drivetrain import data as data
    from drivetrain import facade as facade
    from drivetrain import loggers as loggers
    from drivetrain import plugins as plugins
    from drivetrain import profilers as profilers
    from drivetrain import strategies as strategies
    from drivetrain import trainer as trainer
    from drivetrain import utils as utils
    from drivetrain._utilities.seed import seed_everything
    from drivetrain.big_modeling import (
        cpu_offload,
        disk_offload,
        dispatch_model,
        init_empty_weights,
        init_on_device,
        load_checkpoint_and_dispatch,
    )
    from drivetrain.connector import connect
    from drivetrain.data.prepare import skip_first_batches
    from drivetrain.data.seeding import SeedableRandomSampler
    from drivetrain.facade import Accelerator, AcceleratorState, PartialState
    from drivetrain.facade.notebook import debug_launcher, notebook_launcher
    from drivetrain.strategies.layout import ParallelismConfig, ParallelLayout
    from drivetrain.trainer import DataModule, Trainer, TrainingModule
    from drivetrain.trainer.callbacks import (
        BackboneFinetuning,
        BaseFinetuning,
        BasePredictionWriter,
        BatchSizeFinder,
        DeviceStatsMonitor,
        EMAWeightAveraging,
        GradientAccumulationScheduler,
        LambdaCallback,
        LearningRateFinder,
        ModelPruning,
        RichModelSummary,
        RichProgressBar,
        SpikeDetection,
        StochasticWeightAveraging,
        Timer,
        WeightAveraging,
    )
    from drivetrain.trainer.tuner import Tuner
    from drivetrain.utils.memory import find_executable_batch_size


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        from drivetrain._utilities.lazy import (
            import_submodule,
        )  # here: `import drivetrain` imports nothing else

        submodule = import_submodule(__name__, name)
        if submodule is not None:
            return submodule
        raise AttributeError(f"module 'drivetrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    from drivetrain._utilities.lazy import public_submodules

    return sorted(set(globals()) | set(__all__) | public_submodules(__name__))
