"""The Trainer front door: ``Trainer``, ``TrainingModule``, ``DataModule`` and the callbacks.

``drivetrain.Trainer``, ``drivetrain.TrainingModule`` and ``drivetrain.DataModule`` are these.
"""

from drivetrain.trainer.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    ThroughputMonitor,
    TQDMProgressBar,
)
from drivetrain.trainer.datamodule import DataModule
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.state import RunningStage, TrainerFn, TrainerState, TrainerStatus
from drivetrain.trainer.trainer import Trainer

__all__ = [
    "Callback",
    "DataModule",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "ProgressBar",
    "RunningStage",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Trainer",
    "TrainerFn",
    "TrainerState",
    "TrainerStatus",
    "TrainingModule",
]
