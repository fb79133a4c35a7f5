"""Where logged values go: the loggers (rank 0), ``callback_metrics`` and the progress bar.

The Trainer keeps the epoch values of finished epochs and validation runs here; the values
of the epoch in progress are read from the training :class:`ResultCollection` when asked.

The x-axis (``step``) of the rows sent to loggers is Lightning's, so that a migrated project's
dashboards line up: the number of training batches that stepped the optimizers *before* the
batch in progress (:func:`batches_that_stepped`). A row of step metrics logged after the 4th
optimizer step is at 3; a validation inside a fit is at the value of the batch it follows; the
training epoch's row is one below the steps taken so far; ``validate``/``test`` after a fit are
at the steps taken.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from drivetrain._utilities.snapshots import Restorable
from drivetrain.loggers.logger import DEFAULT_EXPERIMENT, Logger, metrics_to_floats
from drivetrain.loggers.resolve import resolve_loggers as resolve
from drivetrain.trainer.results import ResultCollection


def resolve_loggers(logger: Any, default_root_dir: str) -> list[Logger]:
    """The loggers ``Trainer(logger=...)`` means (the resolver both front doors share), under ``default_root_dir``."""

    return resolve(logger, save_dir=default_root_dir, experiment=DEFAULT_EXPERIMENT, argument="logger")


def batches_that_stepped(global_step: int, total_batches: int, manual_optimization: bool) -> int:
    """Lightning's count behind the logged x-axis: training batches that stepped the optimizers so far.

    With automatic optimisation that is ``global_step``; with manual optimisation every training
    batch counts once, however many optimizers it steps (``global_step`` counts each step).
    """
    return total_batches if manual_optimization else global_step


class MetricsHub(Restorable):
    """The Trainer's view of logged values, and the one place that writes to loggers.

    Args:
        loggers: where logged values go (global rank 0 only).
        epoch: returns the current epoch; every row sent to the loggers carries it as ``epoch``
            (step, epoch-end, validation and test rows alike), so ``groupby("epoch")`` works.
    """

    def __init__(self, loggers: list[Logger], epoch: Callable[[], int] | None = None) -> None:
        self.loggers = loggers
        self._epoch = epoch
        self.persisted: dict[str, Tensor | float] = {}
        self.persisted_prog_bar: dict[str, Tensor | float] = {}
        self.logged: dict[str, float] = {}
        self.train: ResultCollection | None = None
        self.is_global_zero = True
        #: The x-axis of rows logged while a fit's training batch is processed (its step metrics and a
        #: validation after it): the batches that stepped before it. ``None`` outside a fit's batches.
        self.batch_step: int | None = None

    def step_row_at(self, stepped: bool, every_n: int, should_stop: bool) -> int | None:
        """The x-axis at which the batch just trained sends its step metrics; ``None``: it sends none.

        Lightning's rule: only a batch that stepped the optimizers logs (not one that accumulated),
        when the optimizer steps reach a multiple of ``every_n`` or the run was asked to stop.
        """
        at = self.batch_step
        if not stepped or at is None or ((at + 1) % every_n and not should_stop):
            return None
        return at

    def evaluation_step(self, fitting: bool, stepped_so_far: int) -> int:
        """The x-axis of a validation's or test's rows: the batch it follows inside a fit, else the steps taken."""
        if fitting and self.batch_step is not None:
            return self.batch_step
        return stepped_so_far

    # -- reading ------------------------------------------------------------------------------
    def callback_metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = dict(self.persisted)
        train = self.train
        if train is not None:
            metrics.update(train.epoch_values)
            metrics.update(train.live_metrics())
        return metrics

    def progress_bar_metrics(self) -> dict[str, float]:
        """The ``prog_bar=True`` values as numbers (this reads device values: call it only to display)."""
        metrics: dict[str, Any] = dict(self.persisted_prog_bar)
        train = self.train
        if train is not None:
            metrics.update(train.epoch_metrics(prog_bar_only=True))
            metrics.update(train.live_metrics(prog_bar_only=True))
        return metrics_to_floats(metrics)

    # -- recording -----------------------------------------------------------------------------
    def persist(self, collection: ResultCollection) -> None:
        """Keep a finished epoch's (or validation run's) values for callback_metrics and the progress bar."""
        self.persisted.update(collection.live_metrics())
        self.persisted.update(collection.epoch_values)
        self.persisted_prog_bar.update(collection.live_metrics(prog_bar_only=True))
        self.persisted_prog_bar.update(collection.epoch_metrics(prog_bar_only=True))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Send ``metrics`` to every logger (global rank 0 only)."""
        if not metrics or not self.is_global_zero or not self.loggers:
            return
        values = metrics_to_floats(metrics)
        if self._epoch is not None and "epoch" not in values:
            values["epoch"] = self._epoch()
        for logger in self.loggers:
            logger.log_metrics(values, step=step)
        self.logged.update(values)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Record the run's hyperparameters when fit starts (also when there are none, as Lightning does).

        This is also where each logger opens its writer or run, before the first training step
        rather than inside the loop at the first logged step.
        """
        if self.is_global_zero:
            for logger in self.loggers:
                logger.log_hyperparams(dict(params))

    def finalize(self, status: str) -> None:
        if self.is_global_zero:
            for logger in self.loggers:
                logger.finalize(status)

    def log_dir(self, default_root_dir: str) -> str:
        """The first logger's run folder, else ``default_root_dir``."""
        for logger in self.loggers:
            if logger.log_dir is not None:
                return logger.log_dir
        return default_root_dir
