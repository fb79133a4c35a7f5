"""The one resolver of logger settings, for ``Trainer(logger=...)`` and ``Accelerator(log_with=...)``.

Both doors accept the same values: a registered name (``"csv"``, ``"tensorboard"``, ``"wandb"``,
``"mlflow"`` or a user's), ``"all"`` (every registered logger whose package is installed),
``True`` (the default logger: TensorBoard when installed, else CSV), ``False``/``None`` (none), a
:class:`~drivetrain.loggers.Logger` instance, or a list mixing names and instances.

Resolution has two steps because the Accelerator learns the experiment name later than its
settings: :func:`parse_loggers` checks the value where it is given (unknown names and missing
packages fail at once), :func:`build_loggers` creates the named loggers for a folder and an
experiment name. The Trainer does both when it is constructed.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from drivetrain._utilities import imports
from drivetrain.loggers.logger import Logger
from drivetrain.loggers.registry import LoggerRegistry

__all__ = ["build_loggers", "default_logger_name", "logger_kind", "parse_loggers", "resolve_loggers"]

#: A checked logger setting: registered names and logger instances, in the order given.
LoggerSpec = list[str | Logger]


def _logger_class(name: str) -> type[Logger]:
    cls = LoggerRegistry.entry(name).cls
    if not (isinstance(cls, type) and issubclass(cls, Logger)):
        raise TypeError(
            f"The logger {name!r} is registered to {cls!r}, which is not a drivetrain.loggers.Logger subclass."
        )
    return cls


def default_logger_name() -> str:
    """``"tensorboard"`` when the tensorboard package is installed, else ``"csv"`` (as Lightning decides)."""
    return "tensorboard" if imports.package_available("tensorboard") else "csv"


def _accepted(argument: str) -> str:
    names = ", ".join(repr(n) for n in LoggerRegistry.available())
    return (
        f"{argument}= accepts a logger name ({names}), 'all' (every installed one), True (the default "
        f"logger: {default_logger_name()!r} here), False or None (no logger), a drivetrain.loggers.Logger, "
        f"or a list of names and loggers"
    )


def parse_loggers(value: Any, *, argument: str = "logger") -> LoggerSpec:
    """Check a logger setting without creating anything.

    Args:
        value: what the user passed (see the module docstring).
        argument: the parameter's name, for messages (``"logger"``, ``"log_with"``).

    Returns:
        Registered names (each once) and logger instances, in the order given.

    Raises:
        ValueError: an unknown name (the message lists the registered ones).
        TypeError: a value of another kind.
        ImportError: a named logger whose package is missing (the message names the extra).
    """
    if value is None or value is False:
        return []
    if value is True:
        return [default_logger_name()]
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    checked: LoggerSpec = []
    for item in items:
        name = item.value if isinstance(item, Enum) else item
        if isinstance(name, str):
            key = name if name in LoggerRegistry else name.lower()
            if key == "all":
                names = [n for n in LoggerRegistry.available() if _logger_class(n).is_available()]
            elif key in LoggerRegistry:
                _logger_class(key).check_available()
                names = [key]
            else:
                raise ValueError(
                    f"{argument}={value!r} names the logger {name!r}, which is unknown. {_accepted(argument)}."
                )
            checked.extend(n for n in names if n not in checked)
        elif isinstance(item, Logger):
            if not any(item is c for c in checked):
                checked.append(item)
        else:
            raise TypeError(
                f"{argument}={value!r} holds {type(item).__name__} ({item!r}). {_accepted(argument)}."
            )
    return checked


def build_loggers(
    spec: LoggerSpec,
    *,
    save_dir: str | None,
    experiment: str,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    save_dir_hint: str = "",
) -> list[Logger]:
    """Create the loggers ``spec`` names (instances are used as they are).

    Args:
        spec: what :func:`parse_loggers` returned.
        save_dir: the folder for file loggers (``None``: the door has none).
        experiment: the experiment/project name each named logger gets.
        options: constructor arguments per logger name (Accelerate's ``init_kwargs``).
        save_dir_hint: how to give a folder, for the error when a file logger has none.

    Raises:
        ValueError: options for a logger the spec does not name, or a file logger without a folder.
    """
    options = dict(options or {})
    named = [item for item in spec if isinstance(item, str)]
    unknown = sorted(set(options) - set(named))
    if unknown:
        raise ValueError(
            f"Options were given for {', '.join(map(repr, unknown))}, which the logger setting does not name "
            f"(it names {[item if isinstance(item, str) else type(item).__name__ for item in spec]}). "
            f"Name the logger too, or drop its options."
        )
    loggers: list[Logger] = []
    for item in spec:
        if isinstance(item, Logger):
            loggers.append(item)
            continue
        entry = LoggerRegistry.entry(item)
        cls = _logger_class(item)
        if cls.needs_save_dir and save_dir is None:
            raise ValueError(
                f"The {item!r} logger writes files and needs a directory{': ' + save_dir_hint if save_dir_hint else ''}."
            )
        kwargs = {**entry.init_kwargs, **dict(options.get(item, {}))}
        loggers.append(cls.for_experiment(save_dir=save_dir, experiment=experiment, **kwargs))
    return loggers


def resolve_loggers(
    value: Any, *, save_dir: str | None, experiment: str, argument: str = "logger"
) -> list[Logger]:
    """:func:`parse_loggers` then :func:`build_loggers`: the loggers a setting means, created."""
    return build_loggers(parse_loggers(value, argument=argument), save_dir=save_dir, experiment=experiment)


def logger_kind(logger: Logger) -> str | None:
    """The registered name of ``logger``'s class (or of the nearest registered base class), if any."""
    by_class = {entry.cls: entry.name for entry in LoggerRegistry.describe()}
    for cls in type(logger).__mro__:
        if cls in by_class:
            return by_class[cls]
    return None
