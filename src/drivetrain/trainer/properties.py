"""The Trainer's read-only view: ranks, progress, metrics, callbacks, loggers and what is running.

Kept apart from :mod:`drivetrain.trainer.trainer` so that the Trainer class itself holds only
its settings and entry points.
"""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.state import RunningStage, TrainerState, TrainerStatus

if TYPE_CHECKING:
    from torch import nn

    from drivetrain.loggers.logger import Logger
    from drivetrain.profilers import Profiler
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.trainer.callbacks.callback import Callback
    from drivetrain.trainer.datamodule import DataModule
    from drivetrain.trainer.loop_views import EvaluationLoopView, FitLoopView
    from drivetrain.trainer.loops.prediction import PredictionLoop
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.state import FitProgressView


class TrainerProperties:
    """Properties of :class:`~drivetrain.Trainer` (a mixin; the Trainer sets these attributes)."""

    _strategy: Strategy
    _run: RunState
    _fit_progress: FitProgressView
    _default_root_dir: str

    @property
    def run_state(self) -> RunState:
        """What the current (or last) run is made of, as the Trainer's loops, checkpointing and tuner share it.

        For drivetrain's own components and for extensions at the level of the loops (a custom loop, a
        tuner). Callbacks and modules should read the properties documented in ``docs/trainer-state.md``,
        which stay stable; the run state's fields follow the implementation.
        """
        return self._run

    @property
    def state(self) -> TrainerState:
        """``trainer.state``: the entry point (``fn``), its ``status`` and the running ``stage``."""
        return self._run.state

    @property
    def should_stop(self) -> bool:
        """Set it to ``True`` (from a callback or the module) to end the fit at the next check."""
        return self._run.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self._run.should_stop = bool(value)

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
    def device_ids(self) -> list[int]:
        """The indices of the devices this node's processes use (``[0, 1]`` for two CPU processes)."""
        from drivetrain.strategies.parallel import ParallelStrategy

        strategy = self._strategy
        devices = (
            strategy.parallel_devices if isinstance(strategy, ParallelStrategy) else [strategy.root_device]
        )
        return [
            device.index if device.index is not None else position for position, device in enumerate(devices)
        ]

    @property
    def num_devices(self) -> int:
        """How many devices this node's processes use."""
        return len(self.device_ids)

    @property
    def scaler(self) -> Any:
        """The precision's ``torch.amp.GradScaler`` (``"16-mixed"``), else ``None``."""
        return getattr(self._strategy.precision, "scaler", None)

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far in this fit."""
        return self._run.progress.global_step

    @property
    def current_epoch(self) -> int:
        return self._run.progress.epoch

    @property
    def max_epochs(self) -> int:
        return self._run.settings.max_epochs

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step (``drivetrain launch --gradient_accumulation_steps`` when not set).

        Writable during a fit, as :class:`~drivetrain.trainer.callbacks.GradientAccumulationScheduler`
        does at each epoch start: from the next batch on, the optimizer steps every this many batches.
        """
        return self._run.settings.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        from drivetrain.strategies.step_policy import check_accumulation_steps

        steps = check_accumulation_steps(value, "trainer.accumulate_grad_batches")
        self._run.optimization.set_accumulation(steps)  # refuses what the running fit cannot honour
        self._run.settings.accumulate_grad_batches = steps

    @property
    def max_steps(self) -> int:
        return self._run.settings.max_steps

    @property
    def min_epochs(self) -> int:
        """Epochs to train before a stop request (early stopping, ``should_stop``) is honoured (0: none)."""
        return self._run.settings.min_epochs

    @property
    def min_steps(self) -> int:
        """Optimizer steps to take before a stop request is honoured (0: none)."""
        return self._run.settings.min_steps

    @property
    def val_check_interval(self) -> int | float | datetime.timedelta:
        """Validate every this fraction of an epoch (float), number of batches (int), or wall time (timedelta)."""
        return self._run.settings.val_check_interval

    @property
    def limit_train_batches(self) -> int | float:
        """Training batches per epoch: a count (int) or a fraction of the loader (float); ``overfit_batches``
        when overfitting and ``fast_dev_run``'s count under it, as in Lightning."""
        return self._run.features.overfit_batches or self._run.settings.limit_train_batches

    @property
    def limit_val_batches(self) -> int | float:
        """Validation batches per loader: a count (int) or a fraction (float); 0 turns validation off."""
        return self._run.features.overfit_batches or self._run.settings.limit_val_batches

    @property
    def limit_test_batches(self) -> int | float:
        return self._run.settings.limit_test_batches

    @property
    def limit_predict_batches(self) -> int | float:
        return self._run.settings.limit_predict_batches

    @property
    def num_sanity_val_steps(self) -> int | float:
        """Validation batches per loader the sanity check runs before training (``inf`` for all, as Lightning
        reports ``num_sanity_val_steps=-1``; 0 under ``fast_dev_run``)."""
        steps = self._run.settings.num_sanity_val_steps
        return math.inf if steps == -1 else steps

    @property
    def gradient_clip_val(self) -> float | None:
        """The clipping threshold (``None``: no clipping)."""
        return self._run.settings.gradient_clip_val

    @property
    def gradient_clip_algorithm(self) -> str | None:
        """``"norm"`` or ``"value"`` as given (``None``: not given; clipping is by norm)."""
        return self._run.settings.gradient_clip_algorithm

    @property
    def check_val_every_n_epoch(self) -> int | None:
        """Validate in every n-th epoch (``None``: ``val_check_interval`` counts batches across epochs)."""
        return self._run.settings.check_val_every_n_epoch

    @property
    def log_every_n_steps(self) -> int:
        return self._run.settings.log_every_n_steps

    @property
    def fast_dev_run(self) -> int:
        return self._run.settings.fast_dev_run

    @property
    def overfit_batches(self) -> int | float:
        """Training and validation batches (or fraction) each epoch repeats; 0 when not overfitting."""
        return self._run.features.overfit_batches

    @property
    def reload_dataloaders_every_n_epochs(self) -> int:
        return self._run.features.reload_dataloaders_every_n_epochs

    @property
    def barebones(self) -> bool:
        """Whether the Trainer runs without logging, callbacks it adds, checkpoints, bar, summary and sanity check."""
        return self._run.features.barebones

    @property
    def profiler(self) -> Profiler:
        """The run's profiler (a ``PassThroughProfiler`` that records nothing unless ``profiler=`` was given).

        Time your own code with ``with self.trainer.profiler.profile("my_action"):``.
        """
        if self._run.features.profiler is not None:
            return self._run.features.profiler
        from drivetrain.profilers import PassThroughProfiler

        return PassThroughProfiler()

    @property
    def fit_progress(self) -> FitProgressView:
        """Where the current (or last) fit stands: epoch, step, batches done, epoch end, validations run."""
        return self._fit_progress

    @property
    def is_last_batch(self) -> bool:
        """Whether the training batch being processed is the last of its epoch."""
        return self._run.progress.is_last_batch

    @property
    def num_training_batches(self) -> int | float:
        """Training batches per epoch in this process, after ``limit_train_batches`` (``inf`` when unsized).

        An ``int`` whenever the count is finite, as in Lightning, so ``range(trainer.num_training_batches)`` works.
        """
        return _counts([self._run.data.num_training_batches])[0]

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches per loader in this process, after ``limit_val_batches``."""
        return _counts(self._run.data.eval_loaders(RunningStage.VALIDATING)[1])

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """Batches per validation loader that the sanity check runs (``num_sanity_val_steps`` at most)."""
        return _counts(self._run.data.eval_loaders(RunningStage.SANITY_CHECKING)[1])

    @property
    def num_test_batches(self) -> list[int | float]:
        """Test batches per loader in this process, after ``limit_test_batches``."""
        return _counts(self._run.data.eval_loaders(RunningStage.TESTING)[1])

    @property
    def num_predict_batches(self) -> list[int | float]:
        """Prediction batches per loader in this process, after ``limit_predict_batches``."""
        return _counts(self._run.data.eval_loaders(RunningStage.PREDICTING)[1])

    @property
    def callback_metrics(self) -> dict[str, Any]:
        """Everything logged so far: the latest step values and the last epoch/validation values."""
        return self._run.metrics.callback_metrics()

    @property
    def logged_metrics(self) -> dict[str, float]:
        """The values most recently sent to the loggers."""
        return dict(self._run.metrics.logged)

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The ``prog_bar=True`` values as numbers (reads device values: for display)."""
        return self._run.metrics.progress_bar_metrics()

    @property
    def callbacks(self) -> list[Callback]:
        return self._run.callbacks

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        from drivetrain.trainer.callbacks.model_checkpoint import ModelCheckpoint

        return [cb for cb in self._run.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> Any:
        callbacks = self.checkpoint_callbacks
        return callbacks[0] if callbacks else None

    @property
    def early_stopping_callbacks(self) -> list[Any]:
        from drivetrain.trainer.callbacks.early_stopping import EarlyStopping

        return [cb for cb in self._run.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def early_stopping_callback(self) -> Any:
        callbacks = self.early_stopping_callbacks
        return callbacks[0] if callbacks else None

    @property
    def progress_bar_callback(self) -> Any:
        from drivetrain.trainer.callbacks.progress import ProgressBar

        return next((cb for cb in self._run.callbacks if isinstance(cb, ProgressBar)), None)

    @property
    def loggers(self) -> list[Logger]:
        return self._run.metrics.loggers

    @property
    def logger(self) -> Logger | None:
        return self._run.metrics.loggers[0] if self._run.metrics.loggers else None

    @property
    def default_root_dir(self) -> str:
        return self._default_root_dir

    @property
    def log_dir(self) -> str:
        """The first logger's run folder (``default_root_dir`` without loggers)."""
        return self._run.metrics.log_dir(self._default_root_dir)

    @property
    def training_module(self) -> TrainingModule | None:
        """The module of the current (or last) entry point."""
        return self._run.module

    lightning_module = training_module

    @property
    def model(self) -> nn.Module | None:
        """The module as the strategy wrapped it (DDP …) while an entry point runs."""
        return self._run.model

    @property
    def optimizers(self) -> list[Any]:
        return self._run.optimizers

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        return self._run.scheduler_configs

    @property
    def fit_loop(self) -> FitLoopView:
        """Lightning's fit loop as a read-only view of this Trainer's run: ``max_epochs``, ``epoch_progress``,
        ``epoch_loop.batch_progress``, ``epoch_loop.val_loop`` … (:mod:`drivetrain.trainer.loop_views`).

        For callbacks written for Lightning; :attr:`fit_progress` says the same in drivetrain's words.
        """
        from drivetrain.trainer.loop_views import FitLoopView

        return FitLoopView(self._run)

    @property
    def validate_loop(self) -> EvaluationLoopView:
        """Lightning's ``trainer.validate`` loop as a read-only view (``batch_progress``, ``max_batches``)."""
        from drivetrain.trainer.loop_views import EvaluationLoopView

        return EvaluationLoopView(self._run, "validate")

    @property
    def test_loop(self) -> EvaluationLoopView:
        """Lightning's test loop as a read-only view (``batch_progress``, ``max_batches``)."""
        from drivetrain.trainer.loop_views import EvaluationLoopView

        return EvaluationLoopView(self._run, "test")

    @property
    def predict_loop(self) -> PredictionLoop | None:
        """The prediction loop of the current (or last) ``predict`` in this process (``None`` before one).

        A prediction writer reads ``current_batch_indices`` (the dataset indices of the batch being
        predicted), ``predictions`` and ``epoch_batch_indices`` from it, as in Lightning; its
        ``batch_progress`` counts the batches predicted.
        """
        return self._run.predict_loop

    @property
    def datamodule(self) -> DataModule | None:
        return self._run.data.datamodule

    @property
    def train_dataloader(self) -> Any:
        return self._run.data.train_loader

    @property
    def val_dataloaders(self) -> Any:
        return self._eval_dataloaders(RunningStage.VALIDATING)

    @property
    def test_dataloaders(self) -> Any:
        return self._eval_dataloaders(RunningStage.TESTING)

    @property
    def predict_dataloaders(self) -> Any:
        return self._eval_dataloaders(RunningStage.PREDICTING)

    def _eval_dataloaders(self, stage: RunningStage) -> Any:
        loaders = self._run.data.eval_loaders(stage)[0]
        if not loaders:
            return None
        return loaders[0] if len(loaders) == 1 else loaders

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint the current (or last) entry point loaded, if any.

        Set it to make the next entry point called without ``ckpt_path=`` load this one (as
        ``trainer.test(ckpt_path=...)`` would); ``None`` clears it.
        """
        return self._run.ckpt_path

    @ckpt_path.setter
    def ckpt_path(self, path: Any) -> None:
        import os

        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"trainer.ckpt_path = {path!r}: use a path, 'last', 'best' or None.")
        self._run.ckpt_path_set = os.fspath(path) if path is not None else None

    @property
    def ckpt_path_requested(self) -> str | None:
        """What the current (or last) entry point was asked to load: a path, ``"last"``, ``"best"``,
        ``"hpc"`` or ``None``; :attr:`ckpt_path` is the checkpoint that request resolved to."""
        return self._run.ckpt_request

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
    def evaluating(self) -> bool:
        """Whether a validation (its sanity check included) or test loop is running."""
        stage = self.state.stage
        return stage is not None and stage.evaluating

    @property
    def interrupted(self) -> bool:
        return self.state.status == TrainerStatus.INTERRUPTED

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps the whole fit will take (for schedulers such as OneCycleLR)."""
        settings = self._run.settings
        per_epoch = self._run.data.num_training_batches / settings.accumulate_grad_batches
        per_epoch = math.ceil(per_epoch) if not math.isinf(per_epoch) else per_epoch
        total = per_epoch * settings.max_epochs if settings.max_epochs != -1 else math.inf
        return min(total, settings.max_steps) if settings.max_steps != -1 else total


def _counts(lengths: list[float]) -> list[int | float]:
    return [length if math.isinf(length) else int(length) for length in lengths]
