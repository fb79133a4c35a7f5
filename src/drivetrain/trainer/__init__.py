"""The Trainer front door: ``Trainer``, ``TrainingModule``, ``DataModule`` and the callbacks.

``drivetrain.Trainer``, ``drivetrain.TrainingModule`` and ``drivetrain.DataModule`` are these.
Each name is imported on first use: ``from drivetrain.trainer import Trainer`` does not import
the callbacks, loggers or loops, which a Trainer imports when it is built or run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain._utilities.rank_zero import rank_zero_only
    from drivetrain.trainer.callbacks import (
        BackboneFinetuning,
        BaseFinetuning,
        BasePredictionWriter,
        BatchSizeFinder,
        Callback,
        DeviceStatsMonitor,
        EarlyStopping,
        EMAWeightAveraging,
        GradientAccumulationScheduler,
        LambdaCallback,
        LearningRateFinder,
        LearningRateMonitor,
        ModelCheckpoint,
        ModelPruning,
        ModelSummary,
        OnExceptionCheckpoint,
        ProgressBar,
        RichModelSummary,
        RichProgressBar,
        RichProgressBarTheme,
        SpikeDetection,
        StochasticWeightAveraging,
        ThroughputMonitor,
        Timer,
        TQDMProgressBar,
        TrainingSpikeException,
        WeightAveraging,
    )
    from drivetrain.trainer.datamodule import DataModule
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.state import RunningStage, TrainerFn, TrainerState, TrainerStatus
    from drivetrain.trainer.trainer import Trainer
    from drivetrain.trainer.tuner import Tuner

_CALLBACKS = "drivetrain.trainer.callbacks"
_STATE = "drivetrain.trainer.state"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BatchSizeFinder": _CALLBACKS,
        "Callback": _CALLBACKS,
        "BackboneFinetuning": _CALLBACKS,
        "BaseFinetuning": _CALLBACKS,
        "EMAWeightAveraging": _CALLBACKS,
        "ModelPruning": _CALLBACKS,
        "StochasticWeightAveraging": _CALLBACKS,
        "WeightAveraging": _CALLBACKS,
        "EarlyStopping": _CALLBACKS,
        "LearningRateFinder": _CALLBACKS,
        "BasePredictionWriter": _CALLBACKS,
        "DeviceStatsMonitor": _CALLBACKS,
        "GradientAccumulationScheduler": _CALLBACKS,
        "LambdaCallback": _CALLBACKS,
        "LearningRateMonitor": _CALLBACKS,
        "ModelCheckpoint": _CALLBACKS,
        "ModelSummary": _CALLBACKS,
        "OnExceptionCheckpoint": _CALLBACKS,
        "ProgressBar": _CALLBACKS,
        "RichModelSummary": _CALLBACKS,
        "RichProgressBar": _CALLBACKS,
        "RichProgressBarTheme": _CALLBACKS,
        "SpikeDetection": _CALLBACKS,
        "TQDMProgressBar": _CALLBACKS,
        "ThroughputMonitor": _CALLBACKS,
        "Timer": _CALLBACKS,
        "TrainingSpikeException": _CALLBACKS,
        "DataModule": "drivetrain.trainer.datamodule",
        "TrainingModule": "drivetrain.trainer.module",
        "RunningStage": _STATE,
        "TrainerFn": _STATE,
        "TrainerState": _STATE,
        "TrainerStatus": _STATE,
        "Trainer": "drivetrain.trainer.trainer",
        "Tuner": "drivetrain.trainer.tuner",
        "rank_zero_only": "drivetrain._utilities.rank_zero",
    },
)

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
    "DataModule",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelPruning",
    "ModelSummary",
    "OnExceptionCheckpoint",
    "ProgressBar",
    "RichModelSummary",
    "RichProgressBar",
    "RichProgressBarTheme",
    "RunningStage",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Timer",
    "Trainer",
    "TrainerFn",
    "TrainerState",
    "TrainerStatus",
    "TrainingModule",
    "TrainingSpikeException",
    "Tuner",
    "WeightAveraging",
    "rank_zero_only",
]
