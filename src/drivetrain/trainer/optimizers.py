"""What ``configure_optimizers`` may return, checked and normalised; and stepping the LR schedulers."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch.optim.lr_scheduler import ReduceLROnPlateau

_SCHEDULER_KEYS = ("scheduler", "interval", "frequency", "monitor", "strict", "name")
_OPTIMIZER_DICT_KEYS = ("optimizer", "lr_scheduler", "monitor")
_FORMS = (
    "an optimizer; a list of optimizers; ([optimizers], [schedulers]); a dict {'optimizer': opt, "
    "'lr_scheduler': scheduler or {'scheduler': s, 'interval': 'step'|'epoch', 'frequency': n, 'monitor': name}}; "
    "or a list of such dicts"
)


@dataclass
class LRSchedulerConfig:
    """One learning-rate scheduler and when it steps."""

    scheduler: Any
    name: str | None = None
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True

    @property
    def reduce_on_plateau(self) -> bool:
        return isinstance(self.scheduler, ReduceLROnPlateau)


def _is_optimizer(value: Any) -> bool:
    return callable(getattr(value, "step", None)) and hasattr(value, "param_groups")


def _is_scheduler(value: Any) -> bool:
    return callable(getattr(value, "step", None)) and hasattr(value, "optimizer")


def parse_configure_optimizers(
    result: Any, where: str = "configure_optimizers()", automatic: bool = True
) -> tuple[list[Any], list[LRSchedulerConfig]]:
    """Split what ``configure_optimizers`` returned into optimizers and scheduler configs.

    ``automatic``: the Trainer steps the schedulers (automatic optimisation), so a ``ReduceLROnPlateau``
    needs a ``monitor``. In manual optimisation the module steps them itself, as in Lightning: no
    monitor is needed, and one given is ignored (with a warning).

    Raises:
        TypeError: a form other than those documented on ``TrainingModule.configure_optimizers``.
        ValueError: a scheduler setting out of range (interval, frequency, a plateau scheduler without a monitor).
    """
    optimizers, configs = _parse(result, where)
    for config in configs:
        if not automatic:
            if config.monitor is not None:
                warnings.warn(
                    f"{where}: the scheduler's monitor={config.monitor!r} is ignored in manual optimisation; step "
                    f"{type(config.scheduler).__name__} yourself (self.lr_schedulers().step(value)).",
                    UserWarning,
                    stacklevel=4,
                )
        elif config.reduce_on_plateau and config.monitor is None:
            raise ValueError(
                f"{where}: ReduceLROnPlateau steps on a metric; name it with "
                f"{{'scheduler': scheduler, 'monitor': 'val_loss'}} (a name you log with self.log)."
            )
    return optimizers, configs


def _parse(result: Any, where: str) -> tuple[list[Any], list[LRSchedulerConfig]]:
    if result is None:
        raise TypeError(f"{where} returned None; return {_FORMS}.")
    if _is_optimizer(result):
        return [result], []
    if isinstance(result, Mapping):
        return _from_dict(result, where)
    if isinstance(result, (list, tuple)):
        items = list(result)
        if not items:
            raise TypeError(f"{where} returned an empty {type(result).__name__}; return {_FORMS}.")
        if all(_is_optimizer(item) for item in items):
            return items, []
        if all(isinstance(item, Mapping) for item in items):
            optimizers, schedulers = [], []
            for item in items:
                opts, scheds = _from_dict(item, where)
                optimizers += opts
                schedulers += scheds
            return optimizers, schedulers
        if len(items) == 2 and isinstance(items[0], (list, tuple)) and isinstance(items[1], (list, tuple)):
            optimizers = list(items[0])
            if not optimizers or not all(_is_optimizer(o) for o in optimizers):
                raise TypeError(
                    f"{where} returned ([optimizers], [schedulers]) whose first list holds {items[0]!r}."
                )
            return optimizers, [_scheduler_config(s, None, where) for s in items[1]]
    raise TypeError(f"{where} returned {type(result).__name__} ({result!r}); return {_FORMS}.")


def _from_dict(entry: Mapping[str, Any], where: str) -> tuple[list[Any], list[LRSchedulerConfig]]:
    unknown = [k for k in entry if k not in _OPTIMIZER_DICT_KEYS]
    if unknown:
        raise TypeError(
            f"{where} returned a dict with unknown key(s) {', '.join(map(repr, unknown))}; allowed: "
            f"{', '.join(map(repr, _OPTIMIZER_DICT_KEYS))}."
        )
    if "optimizer" not in entry or not _is_optimizer(entry["optimizer"]):
        raise TypeError(
            f"{where} returned a dict without an 'optimizer' entry holding an optimizer: {dict(entry)!r}."
        )
    schedulers = []
    if entry.get("lr_scheduler") is not None:
        schedulers.append(_scheduler_config(entry["lr_scheduler"], entry.get("monitor"), where))
    return [entry["optimizer"]], schedulers


def _scheduler_config(value: Any, monitor: str | None, where: str) -> LRSchedulerConfig:
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in _SCHEDULER_KEYS]
        if unknown:
            raise TypeError(
                f"{where}: the 'lr_scheduler' dict has unknown key(s) {', '.join(map(repr, unknown))}; allowed: "
                f"{', '.join(map(repr, _SCHEDULER_KEYS))}."
            )
        if "scheduler" not in value:
            raise TypeError(
                f"{where}: the 'lr_scheduler' dict needs a 'scheduler' entry, got {dict(value)!r}."
            )
        config = LRSchedulerConfig(
            scheduler=value["scheduler"],
            name=value.get("name"),
            interval=value.get("interval", "epoch"),
            frequency=value.get("frequency", 1),
            monitor=value.get("monitor", monitor),
            strict=value.get("strict", True),
        )
    else:
        config = LRSchedulerConfig(scheduler=value, monitor=monitor)
    if not _is_scheduler(config.scheduler):
        raise TypeError(
            f"{where}: {config.scheduler!r} is not a learning-rate scheduler (no step() and optimizer)."
        )
    if config.interval not in ("step", "epoch"):
        raise ValueError(f"{where}: interval={config.interval!r}; use 'step' or 'epoch'.")
    if isinstance(config.frequency, bool) or not isinstance(config.frequency, int) or config.frequency < 1:
        raise ValueError(f"{where}: frequency={config.frequency!r}; use an int >= 1.")
    return config


def step_schedulers(
    configs: Sequence[LRSchedulerConfig],
    interval: str,
    count: int,
    metrics: Mapping[str, Any],
    step: Callable[[Any, Any], None] | None = None,
) -> None:
    """Step the schedulers of ``interval`` whose ``frequency`` divides ``count`` (steps or epochs done).

    ``step(scheduler, metric)`` (a module's ``lr_scheduler_step``) steps them instead of ``scheduler.step()``.
    """
    for config in configs:
        if config.interval != interval or count % config.frequency:
            continue
        if config.reduce_on_plateau:
            value = metrics.get(config.monitor) if config.monitor is not None else None
            if value is None:
                message = (
                    f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged (logged: "
                    f"{', '.join(sorted(metrics)) or 'nothing'}). Log it with self.log({config.monitor!r}, ...), or "
                    f"set 'strict': False in the scheduler dict to skip such steps."
                )
                if config.strict:
                    raise ValueError(message)
                warnings.warn(message, UserWarning, stacklevel=2)
                continue
            if step is not None:
                step(config.scheduler, float(value))
            else:
                config.scheduler.step(float(value))
        elif step is not None:
            step(config.scheduler, None)
        else:
            config.scheduler.step()
