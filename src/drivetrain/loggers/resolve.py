"""The one resolver of logger settings, for ``Trainer(logger=...)`` and ``Accelerator(log_with=...)``.

Both doors accept the same values: a registered name (``"csv"``, ``"tensorboard"``, ``"wandb"``,
``"mlflow"`` or a user's), ``"all"`` (every registered logger whose package is installed),
``True`` (the default logger: TensorBoard when installed, else CSV), ``False``/``None`` (none), a
:class:`~drivetrain.loggers.Logger` instance, or a list mixing names and instances.

Resolution has two steps because the Accelerator learns the experiment name later than its
settings: :func:`parse_loggers` checks the value where it is given (unknown names and missing
packages fail at once), :func:`build_loggers` creates the named loggers for a folder and an
experiment name. The Trainer does both when it is constructed. The Accelerator also takes
Accelerate's trackers (:mod:`drivetrain.loggers.trackers`): ``GeneralTracker`` instances and names of
tracker classes added to ``LOGGER_TYPE_TO_CLASS``; :func:`build_trackers` gives it every entry as a
tracker, the loggers it builds behind their tracker faces.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

from drivetrain._utilities import imports
from drivetrain.loggers.logger import Logger
from drivetrain.loggers.registry import LoggerRegistry, logger_kind

if TYPE_CHECKING:
    from drivetrain.loggers.trackers import GeneralTracker

__all__ = [
    "build_loggers",
    "build_trackers",
    "default_logger_name",
    "logger_kind",
    "parse_loggers",
    "resolve_loggers",
]

#: A checked logger setting: registered names and logger instances (and, for the Accelerator,
#: tracker instances), in the order given.
LoggerSpec = list["str | Logger | GeneralTracker"]


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


def _accepted(argument: str, trackers: bool) -> str:
    names = ", ".join(repr(n) for n in LoggerRegistry.available())
    tracker = " or a drivetrain.tracking.GeneralTracker" if trackers else ""
    return (
        f"{argument}= accepts a logger name ({names}), 'all' (every installed one), True (the default "
        f"logger: {default_logger_name()!r} here), False or None (no logger), a drivetrain.loggers.Logger"
        f"{tracker}, or a list of names and loggers"
    )


def parse_loggers(value: Any, *, argument: str = "logger", trackers: bool = False) -> LoggerSpec:
    """Check a logger setting without creating anything.

    Args:
        value: what the user passed (see the module docstring).
        argument: the parameter's name, for messages (``"logger"``, ``"log_with"``).
        trackers: also accept Accelerate's trackers (``GeneralTracker`` instances, names of tracker
            classes added to ``LOGGER_TYPE_TO_CLASS``): the Accelerator's setting.

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
    # The tracker module only when trackers are allowed or something else than a name or a logger
    # came: building a Trainer does not import it.
    trackers_module = (
        _trackers() if trackers or any(not isinstance(i, (str, Enum, Logger)) for i in items) else None
    )
    for item in items:
        name = item.value if isinstance(item, Enum) else item
        if isinstance(name, str):
            key = name if name in LoggerRegistry else name.lower()
            if (
                trackers_module is not None
                and trackers
                and trackers_module.custom_tracker_class(name) is not None
            ):
                names = [name]  # a user's tracker class, added to LOGGER_TYPE_TO_CLASS
            elif key == "all":
                names = [n for n in LoggerRegistry.available() if _logger_class(n).is_available()]
            elif key in LoggerRegistry:
                _logger_class(key).check_available()
                names = [key]
            else:
                raise ValueError(
                    f"{argument}={value!r} names the logger {name!r}, which is unknown. "
                    f"{_accepted(argument, trackers)}."
                )
            checked.extend(n for n in names if n not in checked)
        elif isinstance(item, Logger) or (
            trackers and trackers_module is not None and isinstance(item, trackers_module.GeneralTracker)
        ):
            if not any(item is c for c in checked):
                checked.append(item)
        elif trackers_module is not None and isinstance(item, trackers_module.GeneralTracker):
            raise TypeError(
                f"{argument}={value!r} holds the tracker {type(item).__name__}: GeneralTracker is Accelerate's "
                f"tracker interface, which Accelerator(log_with=...) takes. Here write a drivetrain.loggers.Logger "
                f"subclass (log_metrics, log_hyperparams) instead."
            )
        else:
            raise TypeError(
                f"{argument}={value!r} holds {type(item).__name__} ({item!r}). {_accepted(argument, trackers)}."
            )
    return checked


def _trackers() -> Any:
    from drivetrain.loggers import trackers

    return trackers


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
        if not isinstance(item, str):
            raise TypeError(
                f"build_loggers builds loggers; {type(item).__name__} is a tracker (use build_trackers)."
            )
        entry = LoggerRegistry.entry(item)
        cls = _logger_class(item)
        if cls.needs_save_dir and save_dir is None:
            raise ValueError(
                f"The {item!r} logger writes files and needs a directory{': ' + save_dir_hint if save_dir_hint else ''}."
            )
        kwargs = {**entry.init_kwargs, **dict(options.get(item, {}))}
        loggers.append(cls.for_experiment(save_dir=save_dir, experiment=experiment, **kwargs))
    return loggers


def build_trackers(
    spec: LoggerSpec,
    *,
    logging_dir: str | None,
    project_name: str,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    save_dir_hint: str = "",
) -> list[GeneralTracker]:
    """The trackers of an Accelerator's ``log_with`` (:func:`parse_loggers` with ``trackers=True``).

    Tracker instances are used as they are; logger names and instances become loggers behind their
    tracker faces (``tracker.logger``); a user's tracker class named in ``LOGGER_TYPE_TO_CLASS`` is
    built as Accelerate builds it: ``cls(project_name, [logging_dir,] **options[name])``.

    Raises:
        ValueError: options for an entry the spec does not name, or a tracker or file logger that
            needs a folder without one.
    """
    from drivetrain.loggers.trackers import GeneralTracker, custom_tracker_class, tracker_for_logger

    options = dict(options or {})
    custom = {
        item: cls
        for item in spec
        if isinstance(item, str) and (cls := custom_tracker_class(item)) is not None
    }
    loggers = iter(
        build_loggers(
            [item for item in spec if not isinstance(item, GeneralTracker) and item not in custom],
            save_dir=logging_dir,
            experiment=project_name,
            options={name: value for name, value in options.items() if name not in custom},
            save_dir_hint=save_dir_hint,
        )
    )
    built: list[GeneralTracker] = []
    for item in spec:
        if isinstance(item, GeneralTracker):
            built.append(item)
        elif isinstance(item, str) and item in custom:
            cls = custom[item]
            kwargs = dict(options.get(item, {}))
            if cls.requires_logging_directory:
                if logging_dir is None:
                    raise ValueError(
                        f"The {item!r} tracker requires a logging directory"
                        f"{': ' + save_dir_hint if save_dir_hint else ''}."
                    )
                built.append(cls(project_name, logging_dir, **kwargs))  # type: ignore[arg-type, call-arg]
            else:
                built.append(cls(project_name, **kwargs))  # type: ignore[arg-type]
        else:
            built.append(tracker_for_logger(next(loggers)))
    return built


def resolve_loggers(
    value: Any, *, save_dir: str | None, experiment: str, argument: str = "logger"
) -> list[Logger]:
    """:func:`parse_loggers` then :func:`build_loggers`: the loggers a setting means, created."""
    return build_loggers(parse_loggers(value, argument=argument), save_dir=save_dir, experiment=experiment)
