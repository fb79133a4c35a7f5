"""Experiment trackers for the Accelerator (``log_with=``, ``init_trackers``, ``log``, ``end_training``).

Trackers are drivetrain's loggers (:mod:`drivetrain.loggers`): ``"tensorboard"`` and ``"csv"``
by name, or any :class:`~drivetrain.loggers.Logger` instance. They exist on the main process
only; elsewhere logging calls do nothing, so the same script runs on every rank.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from enum import Enum
from typing import Any

from drivetrain.facade.process_control import ProcessControl
from drivetrain.utils.configuration import ProjectConfiguration

TRACKER_NAMES = ("tensorboard", "csv")


def check_log_with(log_with: Any) -> list[Any]:
    """``log_with`` as a list of tracker names and logger instances.

    Raises:
        ValueError: an unknown tracker name.
        TypeError: something that is neither a name nor a logger.
    """
    from drivetrain.loggers import Logger

    if log_with is None:
        return []
    items = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    checked: list[Any] = []
    for item in items:
        name = item.value if isinstance(item, Enum) else item
        if isinstance(name, str):
            if name == "all":
                checked.extend(n for n in TRACKER_NAMES if n not in checked)
            elif name in TRACKER_NAMES:
                if name not in checked:
                    checked.append(name)
            else:
                raise ValueError(
                    f"log_with={log_with!r} names the tracker {name!r}, which drivetrain does not provide. "
                    f"Use {', '.join(map(repr, TRACKER_NAMES))}, 'all', or a drivetrain.loggers.Logger instance."
                )
        elif isinstance(item, Logger):
            checked.append(item)
        else:
            raise TypeError(
                f"log_with accepts tracker names ({', '.join(map(repr, TRACKER_NAMES))}, 'all') and "
                f"drivetrain.loggers.Logger instances, got {type(item).__name__} ({item!r})."
            )
    return checked


def create_trackers(
    wanted: list[Any], project_name: str, logging_dir: str | None, init_kwargs: Mapping[str, Any] | None
) -> list[Any]:
    """Build the named trackers (logger instances are used as they are)."""
    from drivetrain.loggers import CSVLogger, TensorBoardLogger

    init_kwargs = dict(init_kwargs or {})
    unknown = sorted(set(init_kwargs) - {w for w in wanted if isinstance(w, str)})
    if unknown:
        raise ValueError(
            f"init_kwargs has options for {', '.join(map(repr, unknown))}, which log_with does not name "
            f"(it names {[w if isinstance(w, str) else type(w).__name__ for w in wanted]})."
        )
    trackers: list[Any] = []
    for item in wanted:
        if not isinstance(item, str):
            trackers.append(item)
            continue
        if logging_dir is None:
            raise ValueError(
                f"The {item!r} tracker writes files and needs a directory: pass Accelerator(project_dir=...) or "
                f"ProjectConfiguration(logging_dir=...)."
            )
        cls = TensorBoardLogger if item == "tensorboard" else CSVLogger
        trackers.append(cls(os.fspath(logging_dir), name=project_name, **init_kwargs.get(item, {})))
    return trackers


def flatten_values(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts of values as ``outer/inner`` keys (as Accelerate's TensorBoard tracker shows them)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_values(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def warn_no_trackers() -> None:
    warnings.warn(
        "Accelerator.log() records nothing: no tracker is configured. Pass log_with='tensorboard' (or 'csv', "
        "'all') and call init_trackers(project_name) first.",
        UserWarning,
        stacklevel=3,
    )


class Tracking(ProcessControl):
    """``init_trackers``, ``log``, ``get_tracker``, ``end_training`` (mixin of :class:`drivetrain.Accelerator`)."""

    project_configuration: ProjectConfiguration
    trackers: list[Any]
    _log_with: list[Any]
    _trackers_started: bool
    _warned_log: bool

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Start the ``log_with`` trackers (main process only) and record ``config`` as hyperparameters."""
        if self.is_main_process:
            self.trackers = create_trackers(
                self._log_with, project_name, self.project_configuration.logging_dir, init_kwargs
            )
            if config is not None:
                for tracker in self.trackers:
                    tracker.log_hyperparams(config)
        self._trackers_started = True

    def log(
        self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None
    ) -> None:
        """Record scalar ``values`` (nested dicts become ``a/b`` names) at ``step`` on the main process."""
        if not self._log_with:
            if not self._warned_log:
                self._warned_log = True
                warn_no_trackers()
            return
        if not self._trackers_started:
            raise RuntimeError(
                "Accelerator.log() before init_trackers(project_name): start the trackers first."
            )
        if log_kwargs:
            raise TypeError(
                f"log_kwargs={log_kwargs!r} is not supported by drivetrain's trackers; leave it out."
            )
        if self.is_main_process:
            flat = flatten_values(values)
            for tracker in self.trackers:
                tracker.log_metrics(flat, step)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker named ``name`` (``unwrap``: its underlying writer); ``None`` off the main process."""
        for tracker in self.trackers:
            if type(tracker).__name__.lower().startswith(name.lower()):
                return getattr(tracker, "experiment", tracker) if unwrap else tracker
        if self.is_main_process:
            raise ValueError(
                f"No tracker named {name!r}; started: {[type(t).__name__ for t in self.trackers]}."
            )
        return None

    def end_training(self) -> None:
        """Flush and close the trackers (call at the end of the script).

        Unlike Accelerate's, it leaves the process group alone (drivetrain releases it when the
        process exits), so waiting, gathering and saving after it still work.
        """
        for tracker in self.trackers:
            tracker.finalize("success")
        self._trackers_started = False
