"""Experiment trackers for the Accelerator (``log_with=``, ``init_trackers``, ``log``, ``get_tracker``, ``end_training``).

``log_with`` is resolved by the same resolver as ``Trainer(logger=...)``: ``"tensorboard"``,
``"csv"``, ``"wandb"``, ``"mlflow"`` (or a registered name), ``"all"`` (every installed one),
:class:`~drivetrain.loggers.Logger` instances, and Accelerate's trackers: instances of a
:class:`~drivetrain.tracking.GeneralTracker` subclass, or names of tracker classes added to
``LOGGER_TYPE_TO_CLASS``. ``accelerator.trackers`` holds trackers (Accelerate's interface); a
logger works behind its tracker face (``TensorBoardTracker`` …, ``tracker.logger``). As in
Accelerate, trackers are started, logged to and finished on the main process only; elsewhere
these calls do nothing, so the same script runs on every rank.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivetrain.loggers.trackers import GeneralTracker
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.utils.configuration import ProjectConfiguration


def check_log_with(log_with: Any) -> list[Any]:
    """``log_with`` as a list of logger names, loggers and trackers, checked (unknown names, missing packages).

    Raises:
        ValueError: an unknown tracker name.
        TypeError: something that is neither a name, a logger nor a tracker.
        ImportError: a tracker whose package is missing (the message names the extra).
    """
    from drivetrain.loggers.resolve import parse_loggers

    return parse_loggers(log_with, argument="log_with", trackers=True)


def create_trackers(
    wanted: list[Any], project_name: str, logging_dir: str | None, init_kwargs: Mapping[str, Any] | None
) -> list[GeneralTracker]:
    """The trackers for ``project_name`` (tracker and logger instances are used as they are)."""
    from drivetrain.loggers.resolve import build_trackers

    return build_trackers(
        wanted,
        logging_dir=logging_dir,
        project_name=project_name,
        options=init_kwargs,
        save_dir_hint="pass Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...)",
    )


def warn_no_trackers() -> None:
    warnings.warn(
        "Accelerator.log() records nothing: no tracker is configured. Pass log_with='tensorboard' (or 'csv', "
        "'wandb', 'mlflow', 'all') and call init_trackers(project_name) first.",
        UserWarning,
        stacklevel=3,
    )


class Trackers:
    """``init_trackers``, ``log``, ``get_tracker``, ``end_training`` of one Accelerator.

    Args:
        strategy: which process is the main one (trackers run there only).
        log_with: the checked ``log_with`` (:func:`check_log_with`).
        project_configuration: ``logging_dir``.
    """

    def __init__(
        self, strategy: Strategy, log_with: list[Any], project_configuration: ProjectConfiguration
    ) -> None:
        self.strategy = strategy
        self.project_configuration = project_configuration
        self._log_with = log_with
        #: The started trackers (``accelerator.trackers``).
        self.trackers: list[Any] = []
        self._trackers_started = False
        self._warned_log = False

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """See :meth:`drivetrain.Accelerator.init_trackers`."""
        if self.strategy.is_global_zero:
            self.trackers = create_trackers(
                self._log_with, project_name, self.project_configuration.logging_dir, init_kwargs
            )
            for tracker in self.trackers:
                tracker.start()
            if config is not None:
                for tracker in self.trackers:
                    tracker.store_init_configuration(config)
        self._trackers_started = True

    def log(
        self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None
    ) -> None:
        """See :meth:`drivetrain.Accelerator.log`."""
        if not self._log_with:
            if not self._warned_log:
                self._warned_log = True
                warn_no_trackers()
            return
        if not self._trackers_started:
            raise RuntimeError(
                "Accelerator.log() before init_trackers(project_name): start the trackers first."
            )
        if not self.strategy.is_global_zero:
            return
        log_kwargs = dict(log_kwargs or {})
        unknown = sorted(set(log_kwargs) - {tracker.name for tracker in self.trackers})
        if unknown:
            raise ValueError(
                f"log_kwargs names {unknown}, which no started tracker is called (started: "
                f"{[tracker.name for tracker in self.trackers]}). Key log_kwargs by the tracker's name."
            )
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """See :meth:`drivetrain.Accelerator.get_tracker`."""
        from drivetrain.loggers.trackers import GeneralTracker

        wanted = name.lower()
        for tracker in self.trackers:
            names = {str(tracker.name).lower(), type(tracker).__name__.lower()}
            inner = getattr(tracker, "logger", None)
            if inner is not None:
                names.add(type(inner).__name__.lower())
            if wanted in names:
                return tracker.tracker if unwrap else tracker
        if self.strategy.is_global_zero:
            started = [tracker.name for tracker in self.trackers]
            raise ValueError(
                f"No tracker {name!r} was started (started: {started or 'none'}). Name it in log_with= and call "
                f"init_trackers() first."
            )
        return GeneralTracker(_blank=True)

    def end_training(self) -> None:
        """See :meth:`drivetrain.Accelerator.end_training`."""
        for tracker in self.trackers:
            tracker.finish()
        self._trackers_started = False
