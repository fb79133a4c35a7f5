"""``LearningRateMonitor``: log each optimizer's learning rate (and optionally momentum, weight decay).

Names, the moments of logging and the recorded values follow Lightning 2.6: a scheduler's rates are
named after its ``"name"`` or ``lr-<Optimizer>`` (``-1``, ``-2`` … for further optimizers of one
class; ``/<group name>`` or ``/pg<i>`` per parameter group), optimizers without a scheduler follow,
and ``logging_interval=None`` logs each scheduler's rates at its own interval.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


class LearningRateMonitor(Callback):
    """Log learning rates as ``lr-<Optimizer>`` (see the module docstring for the names).

    Args:
        logging_interval: ``"step"`` (every ``log_every_n_steps`` optimizer steps), ``"epoch"`` (each
            epoch start), or ``None``: each scheduler at its own interval, optimizers without one at both.
        log_momentum: also log ``<name>-momentum`` (Adam's ``beta1``; 0 for an optimizer without momentum).
        log_weight_decay: also log ``<name>-weight_decay``.

    Attributes:
        lrs: every learning rate logged so far, by name.
        last_momentum_values: the latest momentum by ``<name>-momentum`` (``None`` until logged).
        last_weight_decay_values: the latest weight decay by ``<name>-weight_decay`` (``None`` until logged).
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
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage == "fit" and not trainer.loggers:
            raise ValueError(
                "LearningRateMonitor needs a logger to write to, but the Trainer has none (logger=False). Pass "
                "logger=True or a Logger, or drop the callback."
            )

    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        entries = self._entries(trainer)
        # As Lightning: the schedulers' optimizers are checked when there are schedulers, else all.
        checked = [o for o, _, interval in entries if interval is not None] or [o for o, _, _ in entries]
        if self.log_momentum and any(
            "momentum" not in o.defaults and "betas" not in o.defaults for o in checked
        ):
            warnings.warn(
                "LearningRateMonitor(log_momentum=True): some optimizers have no momentum; 0 is logged for them.",
                RuntimeWarning,
                stacklevel=2,
            )
        names = [name for _, group_names, _ in entries for name in group_names]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int
    ) -> None:
        if self.logging_interval == "epoch":
            return
        # Lightning's rule: log when the optimizer steps so far (+1 for the one about to come) reach a multiple
        # of log_every_n_steps, or when the fit was asked to stop.
        stepped = trainer.fit_loop.epoch_loop._batches_that_stepped
        if (stepped + 1) % trainer.log_every_n_steps == 0 or trainer.should_stop:
            self._log(trainer, "step" if self.logging_interval is None else "any", stepped)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self.logging_interval != "step":
            interval = "epoch" if self.logging_interval is None else "any"
            self._log(trainer, interval, trainer.fit_loop.epoch_loop._batches_that_stepped)

    def current_values(self, trainer: Trainer, interval: str = "any") -> dict[str, float]:
        """The values this callback logs now, by name (those of the schedulers stepping at ``interval``, and of
        every optimizer without a scheduler); they are added to :attr:`lrs` and the ``last_*`` values."""
        values: dict[str, float] = {}
        for optimizer, names, scheduler_interval in self._entries(trainer):
            if scheduler_interval is not None and interval not in (scheduler_interval, "any"):
                continue
            uses_betas = "betas" in optimizer.defaults
            for group, name in zip(optimizer.param_groups, names):
                self._keep_history(name)
                values[name] = group["lr"]
                self.lrs[name].append(group["lr"])
                if self.log_momentum:
                    momentum = group["betas"][0] if uses_betas else group.get("momentum", 0)
                    values[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = momentum
                if self.log_weight_decay:
                    decay = group["weight_decay"]
                    values[f"{name}-weight_decay"] = self.last_weight_decay_values[f"{name}-weight_decay"] = (
                        decay
                    )
        return values

    def _log(self, trainer: Trainer, interval: str, step: int) -> None:
        values = self.current_values(trainer, interval)
        if values and trainer.is_global_zero:
            trainer.log_metrics(values, step=step)

    def _keep_history(self, name: str) -> None:
        """A parameter group added during the fit (fine-tuning) renames ``lr-X`` to ``lr-X/pg1``: its history moves."""
        if name in self.lrs:
            return
        single = name.removesuffix("/pg1")
        self.lrs[name] = self.lrs.pop(single) if name.endswith("/pg1") and single in self.lrs else []

    def _entries(self, trainer: Trainer) -> list[tuple[Optimizer, list[str], str | None]]:
        """``(optimizer, a name per parameter group, its scheduler's interval or None)``: schedulers first."""
        seen_types: Counter[type] = Counter()
        entries: list[tuple[Optimizer, list[str], str | None]] = []
        with_scheduler: list[Any] = []
        for config in trainer.lr_scheduler_configs:
            optimizer = config.scheduler.optimizer
            custom = getattr(config, "name", None)
            with_scheduler.append(optimizer)
            name = custom if custom is not None else f"lr-{type(optimizer).__name__}"
            entries.append(
                (optimizer, _group_names(optimizer, name, seen_types, custom is None), config.interval)
            )
        for optimizer in trainer.optimizers:
            optimizer = getattr(optimizer, "optimizer", optimizer)  # a wrapper's inner optimizer
            if any(optimizer is seen for seen in with_scheduler):
                continue
            name = f"lr-{type(optimizer).__name__}"
            entries.append((optimizer, _group_names(optimizer, name, seen_types, True), None))
        return entries


def _group_names(optimizer: Optimizer, name: str, seen_types: Counter[type], counted: bool) -> list[str]:
    """One name per parameter group: ``-<n>`` for the n-th further optimizer of a class, ``/<group>`` per group."""
    kind = type(optimizer)
    if counted:
        seen_types[kind] += 1
    groups = optimizer.param_groups
    group_names = [group.get("name", f"pg{index}") for index, group in enumerate(groups, start=1)]
    duplicates = sorted({n for n in group_names if group_names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"LearningRateMonitor: {name} has several parameter groups named {duplicates}; give each group of one "
            f"optimizer its own 'name'."
        )
    if seen_types[kind] > 1:
        name = f"{name}-{seen_types[kind] - 1}"
    if len(groups) > 1:
        return [f"{name}/{group_name}" for group_name in group_names]
    return [f"{name}/{groups[0]['name']}" if groups[0].get("name") else name]
