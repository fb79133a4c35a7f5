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

from drivetrain.facade.process_control import ProcessControl

if TYPE_CHECKING:
    from drivetrain.loggers.trackers import GeneralTracker
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
        """Build and start the ``log_with`` trackers (main process only) and record ``config`` in each.

        Args:
            project_name: the experiment: named trackers write under ``logging_dir/project_name``.
            config: hyperparameters, given to each tracker's ``store_init_configuration``.
            init_kwargs: tracker name -> the keyword arguments its constructor gets
                (``{"wandb": {"entity": "me"}}``).
        """
        if self.is_main_process:
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
        """Give ``values`` at ``step`` to every tracker's ``log`` on the main process.

        Args:
            values: the values; drivetrain's trackers take numbers and one-element tensors (nested
                dicts become ``a/b`` names), TensorBoard's strings too; your own trackers get them as given.
            step: the step they belong to.
            log_kwargs: tracker name -> keyword arguments for that tracker's ``log``.

        Raises:
            RuntimeError: before ``init_trackers``.
            ValueError: ``log_kwargs`` for a tracker that is not started.
        """
        if not self._log_with:
            if not self._warned_log:
                self._warned_log = True
                warn_no_trackers()
            return
        if not self._trackers_started:
            raise RuntimeError(
                "Accelerator.log() before init_trackers(project_name): start the trackers first."
            )
        if not self.is_main_process:
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
        """The started tracker called ``name`` (``"wandb"``, your tracker's ``name`` …).

        Args:
            name: the tracker's ``name``; a logger's class name (``"WandbLogger"``) works too.
            unwrap: return what it writes through (its ``tracker``): the ``SummaryWriter``, the W&B
                run, the ``MlflowClient`` (Accelerate returns the active MLflow run there).

        Off the main process, where no tracker runs, a blank tracker whose methods do nothing (as
        in Accelerate), so ``get_tracker("wandb").log(...)`` runs on every rank.

        Raises:
            ValueError: (main process) no started tracker has that name.
        """
        from drivetrain.loggers.trackers import GeneralTracker

        wanted = name.lower()
        for tracker in self.trackers:
            names = {str(tracker.name).lower(), type(tracker).__name__.lower()}
            inner = getattr(tracker, "logger", None)
            if inner is not None:
                names.add(type(inner).__name__.lower())
            if wanted in names:
                return tracker.tracker if unwrap else tracker
        if self.is_main_process:
            started = [tracker.name for tracker in self.trackers]
            raise ValueError(
                f"No tracker {name!r} was started (started: {started or 'none'}). Name it in log_with= and call "
                f"init_trackers() first."
            )
        return GeneralTracker(_blank=True)

    def end_training(self) -> None:
        """Finish the trackers, ending their runs (call at the end of the script).

        Unlike Accelerate's, it leaves the process group alone (drivetrain releases it when the
        process exits), so waiting, gathering and saving after it still work.
        """
        for tracker in self.trackers:
            tracker.finish()
        self._trackers_started = False
