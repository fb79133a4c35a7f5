"""The Trainer's read-only view: ranks, progress, metrics, callbacks, loggers and what is running.

Kept apart from :mod:`drivetrain.trainer.trainer` so that the Trainer class itself holds only
its settings and entry points.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.state import RunningStage, TrainerState, TrainerStatus

if TYPE_CHECKING:
    from torch import nn

    from drivetrain.loggers.logger import Logger
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.trainer.callbacks.callback import Callback
    from drivetrain.trainer.config import LoopSettings
    from drivetrain.trainer.data_connector import DataConnector
    from drivetrain.trainer.datamodule import DataModule
    from drivetrain.trainer.logger_connector import MetricsHub
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.state import FitProgress


class TrainerProperties:
    """Properties of :class:`~drivetrain.Trainer` (a mixin; the Trainer sets these attributes)."""

    _strategy: Strategy
    _settings: LoopSettings
    _progress: FitProgress
    _metrics: MetricsHub
    _callbacks: list[Callback]
    _data: DataConnector
    _module: TrainingModule
    _model: nn.Module
    _optimizers: list[Any]
    _scheduler_configs: list[Any]
    _default_root_dir: str
    state: TrainerState

    @property
    def strategy(self) -> Strategy:
        return self._strategy

    @property
    def accelerator(self) -> Any:
        return self._strategy.accelerator

    @property
    def precision_plugin(self) -> Any:
        return self._strategy.precision

    @property
    def precision(self) -> str:
        """The precision's name (``"32-true"``, ``"bf16-mixed"`` …)."""
        return self._strategy.precision.name

    @property
    def global_rank(self) -> int:
        return self._strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self._strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self._strategy.node_rank

    @property
    def world_size(self) -> int:
        return self._strategy.world_size

    @property
    def num_nodes(self) -> int:
        return self._strategy.num_nodes

    @property
    def is_global_zero(self) -> bool:
        return self._strategy.is_global_zero

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far in this fit."""
        return self._progress.global_step

    @property
    def current_epoch(self) -> int:
        return self._progress.epoch

    @property
    def max_epochs(self) -> int:
        return self._settings.max_epochs

    @property
    def max_steps(self) -> int:
        return self._settings.max_steps

    @property
    def log_every_n_steps(self) -> int:
        return self._settings.log_every_n_steps

    @property
    def fast_dev_run(self) -> int:
        return self._settings.fast_dev_run

    @property
    def num_training_batches(self) -> float:
        return self._data.num_training_batches

    @property
    def callback_metrics(self) -> dict[str, Any]:
        """Everything logged so far: the latest step values and the last epoch/validation values."""
        return self._metrics.callback_metrics()

    @property
    def logged_metrics(self) -> dict[str, float]:
        """The values most recently sent to the loggers."""
        return dict(self._metrics.logged)

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The ``prog_bar=True`` values as numbers (reads device values: for display)."""
        return self._metrics.progress_bar_metrics()

    @property
    def callbacks(self) -> list[Callback]:
        return self._callbacks

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        from drivetrain.trainer.callbacks.model_checkpoint import ModelCheckpoint

        return [cb for cb in self._callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> Any:
        callbacks = self.checkpoint_callbacks
        return callbacks[0] if callbacks else None

    @property
    def early_stopping_callback(self) -> Any:
        from drivetrain.trainer.callbacks.early_stopping import EarlyStopping

        return next((cb for cb in self._callbacks if isinstance(cb, EarlyStopping)), None)

    @property
    def progress_bar_callback(self) -> Any:
        from drivetrain.trainer.callbacks.progress import ProgressBar

        return next((cb for cb in self._callbacks if isinstance(cb, ProgressBar)), None)

    @property
    def loggers(self) -> list[Logger]:
        return self._metrics.loggers

    @property
    def logger(self) -> Logger | None:
        return self._metrics.loggers[0] if self._metrics.loggers else None

    @property
    def default_root_dir(self) -> str:
        return self._default_root_dir

    @property
    def log_dir(self) -> str:
        """The first logger's run folder (``default_root_dir`` without loggers)."""
        return self._metrics.log_dir(self._default_root_dir)

    @property
    def training_module(self) -> TrainingModule | None:
        """The module of the current (or last) entry point."""
        return self._module

    lightning_module = training_module

    @property
    def model(self) -> nn.Module | None:
        """The module as the strategy wrapped it (DDP …) while an entry point runs."""
        return self._model

    @property
    def optimizers(self) -> list[Any]:
        return self._optimizers

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        return self._scheduler_configs

    @property
    def datamodule(self) -> DataModule | None:
        return self._data.datamodule

    @property
    def train_dataloader(self) -> Any:
        return self._data.train_loader

    @property
    def val_dataloaders(self) -> Any:
        loaders = self._data.eval_loaders(RunningStage.VALIDATING)[0]
        return loaders[0] if len(loaders) == 1 else loaders

    @property
    def training(self) -> bool:
        return self.state.stage == RunningStage.TRAINING

    @property
    def sanity_checking(self) -> bool:
        return self.state.stage == RunningStage.SANITY_CHECKING

    @property
    def validating(self) -> bool:
        return self.state.stage == RunningStage.VALIDATING

    @property
    def testing(self) -> bool:
        return self.state.stage == RunningStage.TESTING

    @property
    def predicting(self) -> bool:
        return self.state.stage == RunningStage.PREDICTING

    @property
    def interrupted(self) -> bool:
        return self.state.status == TrainerStatus.INTERRUPTED

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps the whole fit will take (for schedulers such as OneCycleLR)."""
        settings = self._settings
        per_epoch = self._data.num_training_batches / settings.accumulate_grad_batches
        per_epoch = math.ceil(per_epoch) if not math.isinf(per_epoch) else per_epoch
        total = per_epoch * settings.max_epochs if settings.max_epochs != -1 else math.inf
        return min(total, settings.max_steps) if settings.max_steps != -1 else total
