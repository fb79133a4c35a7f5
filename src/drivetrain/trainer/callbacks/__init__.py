"""Callbacks: self-contained additions to a Trainer run (checkpointing, early stopping, progress …)."""

from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.callbacks.early_stopping import EarlyStopping
from drivetrain.trainer.callbacks.lr_monitor import LearningRateMonitor
from drivetrain.trainer.callbacks.model_checkpoint import ModelCheckpoint
from drivetrain.trainer.callbacks.model_summary import ModelSummary
from drivetrain.trainer.callbacks.progress import ProgressBar, TQDMProgressBar
from drivetrain.trainer.callbacks.throughput import ThroughputMonitor

__all__ = [
    "Callback",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "ProgressBar",
    "TQDMProgressBar",
    "ThroughputMonitor",
]
