"""Callbacks: self-contained additions to a Trainer run (checkpointing, early stopping, progress …).

Each is imported on first use; a Trainer imports only the ones it is given or adds by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain.trainer.callbacks.accumulation_scheduler import GradientAccumulationScheduler
    from drivetrain.trainer.callbacks.batch_size_finder import BatchSizeFinder
    from drivetrain.trainer.callbacks.callback import Callback
    from drivetrain.trainer.callbacks.device_stats import DeviceStatsMonitor
    from drivetrain.trainer.callbacks.early_stopping import EarlyStopping
    from drivetrain.trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
    from drivetrain.trainer.callbacks.lambda_callback import LambdaCallback
    from drivetrain.trainer.callbacks.lr_finder import LearningRateFinder
    from drivetrain.trainer.callbacks.lr_monitor import LearningRateMonitor
    from drivetrain.trainer.callbacks.model_checkpoint import ModelCheckpoint
    from drivetrain.trainer.callbacks.model_summary import ModelSummary
    from drivetrain.trainer.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
    from drivetrain.trainer.callbacks.prediction_writer import BasePredictionWriter
    from drivetrain.trainer.callbacks.progress import ProgressBar, TQDMProgressBar
    from drivetrain.trainer.callbacks.pruning import ModelPruning
    from drivetrain.trainer.callbacks.rich_progress import RichProgressBar, RichProgressBarTheme
    from drivetrain.trainer.callbacks.rich_summary import RichModelSummary
    from drivetrain.trainer.callbacks.spike import SpikeDetection, TrainingSpikeException
    from drivetrain.trainer.callbacks.stochastic_weight_avg import StochasticWeightAveraging
    from drivetrain.trainer.callbacks.throughput import ThroughputMonitor
    from drivetrain.trainer.callbacks.timer import Timer
    from drivetrain.trainer.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

_PROGRESS = "drivetrain.trainer.callbacks.progress"
_RICH_PROGRESS = "drivetrain.trainer.callbacks.rich_progress"
_SPIKE = "drivetrain.trainer.callbacks.spike"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BatchSizeFinder": "drivetrain.trainer.callbacks.batch_size_finder",
        "Callback": "drivetrain.trainer.callbacks.callback",
        "BackboneFinetuning": "drivetrain.trainer.callbacks.finetuning",
        "BaseFinetuning": "drivetrain.trainer.callbacks.finetuning",
        "EMAWeightAveraging": "drivetrain.trainer.callbacks.weight_averaging",
        "ModelPruning": "drivetrain.trainer.callbacks.pruning",
        "StochasticWeightAveraging": "drivetrain.trainer.callbacks.stochastic_weight_avg",
        "WeightAveraging": "drivetrain.trainer.callbacks.weight_averaging",
        "EarlyStopping": "drivetrain.trainer.callbacks.early_stopping",
        "LearningRateFinder": "drivetrain.trainer.callbacks.lr_finder",
        "BasePredictionWriter": "drivetrain.trainer.callbacks.prediction_writer",
        "DeviceStatsMonitor": "drivetrain.trainer.callbacks.device_stats",
        "GradientAccumulationScheduler": "drivetrain.trainer.callbacks.accumulation_scheduler",
        "LambdaCallback": "drivetrain.trainer.callbacks.lambda_callback",
        "LearningRateMonitor": "drivetrain.trainer.callbacks.lr_monitor",
        "ModelCheckpoint": "drivetrain.trainer.callbacks.model_checkpoint",
        "ModelSummary": "drivetrain.trainer.callbacks.model_summary",
        "OnExceptionCheckpoint": "drivetrain.trainer.callbacks.on_exception_checkpoint",
        "ProgressBar": _PROGRESS,
        "RichModelSummary": "drivetrain.trainer.callbacks.rich_summary",
        "RichProgressBar": _RICH_PROGRESS,
        "RichProgressBarTheme": _RICH_PROGRESS,
        "SpikeDetection": _SPIKE,
        "TQDMProgressBar": _PROGRESS,
        "ThroughputMonitor": "drivetrain.trainer.callbacks.throughput",
        "Timer": "drivetrain.trainer.callbacks.timer",
        "TrainingSpikeException": _SPIKE,
    },
)

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
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
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Timer",
    "TrainingSpikeException",
    "WeightAveraging",
]
