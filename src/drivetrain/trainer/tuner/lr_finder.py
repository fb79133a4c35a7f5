"""The learning-rate range test: train with a rising learning rate and see where the loss falls fastest.

From ``min_lr`` to ``max_lr`` over ``num_training`` optimizer steps (geometrically or linearly), the
loss after each step is recorded, smoothed (an exponential moving average with bias correction,
weight 0.98). The test stops early once the smoothed loss exceeds ``early_stop_threshold`` times the
best so far (the model diverges). The suggestion is the learning rate where the smoothed loss falls
most steeply against the rate. The rates, the smoothing, the stop and the suggestion follow
Lightning's range test, so a ported program gets the same suggestion (in one process; under DDP each
step's loss is the mean over the processes). Afterwards the weights, optimizer, schedulers and
generators are as before.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from drivetrain._utilities.imports import require
from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.tuner.attributes import find_lr_attribute, set_attribute
from drivetrain.trainer.tuner.trial import run_steps, tuning_session

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_MODES = ("exponential", "linear")
_SMOOTHING = 0.98
#: The file ``Tuner.lr_find`` and ``LearningRateFinder`` write in ``default_root_dir`` (with matplotlib).
PLOT_FILE = "lr_find.png"


def check_lr_find_arguments(
    min_lr: Any,
    max_lr: Any,
    num_training: Any,
    mode: Any,
    early_stop_threshold: Any,
    name: str = "num_training",
) -> None:
    """Raise a clear error for settings the range test cannot use."""
    for label, value in (("min_lr", min_lr), ("max_lr", max_lr)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"{label}={value!r}; use a positive, finite learning rate.")
    if min_lr >= max_lr:
        raise ValueError(
            f"min_lr={min_lr} must be below max_lr={max_lr}: the test raises the rate from one to the other."
        )
    if isinstance(num_training, bool) or not isinstance(num_training, int) or num_training < 2:
        raise ValueError(
            f"{name}={num_training!r}; use an int >= 2 (optimizer steps of the test; 100 is typical)."
        )
    if mode not in _MODES:
        raise ValueError(f"mode={mode!r}; use 'exponential' (geometric steps, the default) or 'linear'.")
    if early_stop_threshold is not None and (
        isinstance(early_stop_threshold, bool)
        or not isinstance(early_stop_threshold, (int, float))
        or early_stop_threshold <= 0
    ):
        raise ValueError(
            f"early_stop_threshold={early_stop_threshold!r}; use a positive number (stop when the loss exceeds that "
            f"many times the best loss) or None to run every step."
        )


class LRFinder:
    """The result of a learning-rate range test: ``results``, :meth:`suggestion` and :meth:`plot`.

    Attributes:
        results: ``{"lr": [...], "loss": [...]}``, one entry per optimizer step of the test (the loss
            smoothed).
        plot_path: where the plot was saved after the test (``None`` without matplotlib).
    """

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode = mode
        self.lr_min = lr_min
        self.lr_max = lr_max
        self.num_training = num_training
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self.plot_path: str | None = None
        self._optimal_idx: int | None = None

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based) of the test.

        As Lightning's range test schedules it, so a ported program tests the same rates: ``min_lr`` first,
        then from the second step on the fraction ``(step + 1) / num_training`` of the way to ``max_lr``
        (geometrically or linearly), which reaches ``max_lr`` at the last step.
        """
        if step <= 0:
            return self.lr_min
        fraction = min(step + 1, self.num_training) / self.num_training
        if self.mode == "linear":
            return self.lr_min + fraction * (self.lr_max - self.lr_min)
        return self.lr_min * (self.lr_max / self.lr_min) ** fraction

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate where the smoothed loss falls most steeply against the rate, or ``None`` (with a warning) when
        fewer than two finite losses remain after leaving out the first ``skip_begin`` and last ``skip_end``."""
        losses = self.results["loss"]
        indices = [i for i in range(skip_begin, len(losses) - skip_end) if math.isfinite(losses[i])]
        if len(indices) < 2:
            warnings.warn(
                f"The learning-rate finder has {len(indices)} finite loss value(s) after skipping the first "
                f"{skip_begin} and last {skip_end} of {len(losses)}, too few to suggest a learning rate. Run more "
                f"steps (num_training; the Trainer's max_epochs also ends the test), raise early_stop_threshold, or "
                f"lower max_lr.",
                UserWarning,
                stacklevel=2,
            )
            self._optimal_idx = None
            return None
        # The slope of the loss against the learning rate (not the step), as Lightning computes it.
        values = torch.tensor([losses[i] for i in indices])
        rates = torch.tensor([self.results["lr"][i] for i in indices])
        slopes = torch.gradient(values, spacing=[rates])[0]
        self._optimal_idx = indices[int(torch.argmin(slopes))]
        return self.results["lr"][self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None, path: str | None = None) -> Any:
        """Loss against learning rate (log scale in exponential mode); returns the matplotlib ``Figure``.

        Args:
            suggest: mark the suggested learning rate.
            show: show the figure (``matplotlib.pyplot.show``).
            ax: draw on this matplotlib ``Axes`` instead of a new figure.
            path: also save the figure there as a PNG.
        """

        require("matplotlib", extra="plot", feature="LRFinder.plot()")
        if ax is None:
            if show:
                import matplotlib.pyplot as plt

                figure, ax = plt.subplots()
            else:
                from matplotlib.figure import Figure

                figure = Figure()  # off screen: no GUI backend, no pyplot state
                ax = figure.add_subplot()
        else:
            figure = ax.figure
        lrs, losses = self.results["lr"], self.results["loss"]
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest:
            lr = self.suggestion()
            if lr is not None and self._optimal_idx is not None:
                ax.plot(lr, losses[self._optimal_idx], markersize=10, marker="o", color="red")
                ax.set_title(f"Suggested learning rate: {lr:.3g}")
        if path is not None:
            from drivetrain._utilities import paths

            target = paths.normalize(path)
            paths.makedirs(paths.parent(target))
            with paths.open_file(target, "wb") as file:  # local or remote (s3://...)
                figure.savefig(file, format="png")
        if show:
            import matplotlib.pyplot as plt

            plt.show()
        return figure


class _RangeTest(Callback):
    """Sets each step's learning rate and records the (smoothed) loss after it."""

    def __init__(
        self, finder: LRFinder, optimizer: torch.optim.Optimizer, early_stop_threshold: float | None
    ) -> None:
        self.finder = finder
        self.optimizer = optimizer
        self.early_stop_threshold = early_stop_threshold
        self.average = 0.0
        self.best = math.inf
        self.steps = 0

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int
    ) -> None:
        lr = self.finder.lr_at(min(trainer.global_step, self.finder.num_training - 1))
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self.steps:
            return  # inside an accumulation window: the step comes with its last batch
        self.steps = step
        results = self.finder.results
        results["lr"].append(self.finder.lr_at(step - 1))
        # Lightning's outputs: {"loss": the detached loss} ({} for a skipped batch).
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is None:  # the module skipped the batch: no loss to record, as in Lightning
            results["loss"].append(math.nan)
            return
        value = float(loss.detach())
        if trainer.world_size > 1:  # every process decides the same: the mean over them
            value = float(trainer.strategy.all_reduce(torch.tensor(value), reduce_op="mean"))
        # Lightning's smoothing: a moving average, bias-corrected with the step count (from 1) plus one.
        self.average = _SMOOTHING * self.average + (1 - _SMOOTHING) * value
        smoothed = self.average / (1 - _SMOOTHING ** (step + 1))
        results["loss"].append(smoothed)
        threshold = self.early_stop_threshold
        if threshold is not None and step > 1 and (smoothed > threshold * self.best or math.isnan(smoothed)):
            trainer.should_stop = True  # diverging (a NaN loss also stops here; Lightning would go on)
        if smoothed < self.best or step == 1:
            self.best = smoothed


def lr_find(
    trainer: Trainer,
    module: TrainingModule,
    *,
    min_lr: float = 1e-8,
    max_lr: float = 1.0,
    num_training: int = 100,
    mode: str = "exponential",
    early_stop_threshold: float | None = 4.0,
    update_attr: bool = True,
    attr_name: str = "",
    plot_dir: str | None = None,
) -> LRFinder:
    """Run the range test inside the current fit (from ``on_fit_start``) and restore the training state.

    With ``update_attr`` the suggestion is written to the module's (and DataModule's) ``lr``,
    ``learning_rate`` or ``attr_name`` attribute, and to the learning rate of the fit's optimizer
    (scaled like the current one when a scheduler has changed it). With matplotlib installed the plot
    is saved as ``plot_dir/lr_find.png`` on global rank 0.
    """
    check_lr_find_arguments(min_lr, max_lr, num_training, mode, early_stop_threshold)
    if not module.automatic_optimization:
        raise ValueError(
            f"The learning-rate finder steps the optimizer itself, but {type(module).__name__}.automatic_optimization "
            f"is False (manual optimisation). Run it with automatic optimisation."
        )
    optimizers = trainer.optimizers
    if len(optimizers) != 1:
        raise ValueError(
            f"The learning-rate finder tunes one optimizer; configure_optimizers() returned {len(optimizers)}."
        )
    attribute = find_lr_attribute(module, trainer.datamodule, attr_name) if update_attr else None
    finder = LRFinder(mode, float(min_lr), float(max_lr), num_training)
    recorder = _RangeTest(finder, optimizers[0], early_stop_threshold)
    with tuning_session(trainer):
        run_steps(trainer, num_training, [recorder])
    finder.results = trainer.strategy.broadcast(finder.results)
    lr = finder.suggestion() if len(finder.results["loss"]) else None
    if lr is None and not finder.results["loss"]:
        warnings.warn(
            "The learning-rate finder recorded no loss (training_step returned None).",
            UserWarning,
            stacklevel=2,
        )
    if attribute is not None and lr is not None:
        set_attribute(module, trainer.datamodule, attribute, lr)
        _set_optimizer_lr(trainer, lr)
        get_logger(__name__).info(f"Learning rate set to {lr:.4g} ({attribute}).")
    if plot_dir is not None and trainer.is_global_zero and finder.results["loss"]:
        from drivetrain._utilities.imports import package_available

        if package_available("matplotlib"):
            from drivetrain._utilities import paths

            path = paths.join(plot_dir, PLOT_FILE)
            finder.plot(suggest=lr is not None, path=path)
            finder.plot_path = path
    return finder


def _set_optimizer_lr(trainer: Trainer, lr: float) -> None:
    """The fit's optimizer (and its schedulers' base rates) start from ``lr``, keeping a scheduler's factor."""
    for optimizer in trainer.optimizers:
        for group in optimizer.param_groups:
            base = group.get("initial_lr", group["lr"])
            factor = group["lr"] / base if base else 1.0
            group["lr"] = lr * factor
            if "initial_lr" in group:
                group["initial_lr"] = lr
    for config in trainer.lr_scheduler_configs:
        scheduler = config.scheduler
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
