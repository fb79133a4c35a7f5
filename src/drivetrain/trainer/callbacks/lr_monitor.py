"""``LearningRateMonitor``: log each optimizer's learning rate (and optionally momentum, weight decay)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


class LearningRateMonitor(Callback):
    """Log learning rates as ``lr-<Optimizer>`` (``/pg<i>`` per parameter group when there are several).

    Args:
        logging_interval: ``"step"`` (every ``log_every_n_steps``), ``"epoch"`` (each epoch start),
            or ``None``: ``"step"`` when a scheduler steps per step, else ``"epoch"``.
        log_momentum: also log ``momentum-<Optimizer>`` (Adam's ``beta1``).
        log_weight_decay: also log ``weight_decay-<Optimizer>``.
    """

    def __init__(
        self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False
    ) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ValueError(
                f"LearningRateMonitor(logging_interval={logging_interval!r}); use 'step', 'epoch' or None."
            )
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self._interval = "epoch"
        self._names: list[str] = []

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage == "fit" and not trainer.loggers:
            raise ValueError(
                "LearningRateMonitor needs a logger to write to, but the Trainer has none (logger=False). Pass "
                "logger=True or a Logger, or drop the callback."
            )

    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        stepping = any(config.interval == "step" for config in trainer.lr_scheduler_configs)
        self._interval = self.logging_interval or ("step" if stepping else "epoch")
        counts = Counter(type(o).__name__ for o in trainer.optimizers)
        seen: Counter[str] = Counter()
        self._names = []
        for optimizer in trainer.optimizers:
            name = type(optimizer).__name__
            seen[name] += 1
            self._names.append(name if counts[name] == 1 else f"{name}-{seen[name] - 1}")

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int
    ) -> None:
        if (
            self._interval == "step"
            and trainer.fit_progress.total_batches_done % trainer.log_every_n_steps == 0
        ):
            self._log(trainer)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._interval == "epoch":
            self._log(trainer)

    def current_values(self, trainer: Trainer) -> dict[str, float]:
        """The values this callback logs, by name."""
        values: dict[str, float] = {}
        for name, optimizer in zip(self._names, trainer.optimizers):
            groups = optimizer.param_groups
            for index, group in enumerate(groups):
                suffix = f"/pg{index + 1}" if len(groups) > 1 else ""
                values[f"lr-{name}{suffix}"] = float(group["lr"])
                if self.log_momentum:
                    momentum = group.get("momentum", group.get("betas", (None,))[0])
                    if momentum is not None:
                        values[f"momentum-{name}{suffix}"] = float(momentum)
                if self.log_weight_decay and "weight_decay" in group:
                    values[f"weight_decay-{name}{suffix}"] = float(group["weight_decay"])
        return values

    def _log(self, trainer: Trainer) -> None:
        if trainer.is_global_zero:
            trainer.log_metrics(self.current_values(trainer))
