"""Experiment trackers for the Accelerator (``log_with=``, ``init_trackers``, ``log``, ``get_tracker``, ``end_training``).

Trackers are drivetrain's loggers (:mod:`drivetrain.loggers`), resolved by the same resolver as
``Trainer(logger=...)``: ``"tensorboard"``, ``"csv"``, ``"wandb"``, ``"mlflow"`` (or a registered
name), ``"all"`` (every installed one), or :class:`~drivetrain.loggers.Logger` instances. They
exist on the main process only; elsewhere logging calls do nothing, so the same script runs on
every rank.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from drivetrain.facade.process_control import ProcessControl

if TYPE_CHECKING:
    from drivetrain.utils.configuration import ProjectConfiguration


def check_log_with(log_with: Any) -> list[Any]:
    """``log_with`` as a list of logger names and instances, checked (unknown names, missing packages).

    Raises:
        ValueError: an unknown tracker name.
        TypeError: something that is neither a name nor a logger.
        ImportError: a tracker whose package is missing (the message names the extra).
    """
    from drivetrain.loggers.resolve import parse_loggers

    return parse_loggers(log_with, argument="log_with")


def create_trackers(
    wanted: list[Any], project_name: str, logging_dir: str | None, init_kwargs: Mapping[str, Any] | None
) -> list[Any]:
    """Build the named trackers for ``project_name`` (logger instances are used as they are)."""
    from drivetrain.loggers.resolve import build_loggers

    return build_loggers(
        wanted,
        save_dir=logging_dir,
        experiment=project_name,
        options=init_kwargs,
        save_dir_hint="pass Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...)",
    )


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
        """The started tracker registered as ``name`` (``"wandb"`` …) or of that class name.

        Args:
            name: the tracker's registered name, or its class name (``"WandbLogger"``).
            unwrap: return what it writes through instead: the ``SummaryWriter``, the W&B run,
                the ``MlflowClient`` (Accelerate returns the active MLflow run there).

        Returns ``None`` off the main process, where no tracker runs.
        """
        from drivetrain.loggers.resolve import logger_kind

        for tracker in self.trackers:
            if name.lower() in (str(logger_kind(tracker)).lower(), type(tracker).__name__.lower()):
                return tracker.experiment if unwrap and hasattr(tracker, "experiment") else tracker
        if self.is_main_process:
            started = [logger_kind(t) or type(t).__name__ for t in self.trackers]
            raise ValueError(
                f"No tracker {name!r} was started (started: {started or 'none'}). Name it in log_with= and call "
                f"init_trackers() first."
            )
        return None

    def end_training(self) -> None:
        """Flush and close the trackers, ending their runs (call at the end of the script).

        Unlike Accelerate's, it leaves the process group alone (drivetrain releases it when the
        process exits), so waiting, gathering and saving after it still work.
        """
        for tracker in self.trackers:
            tracker.finish("success")
        self._trackers_started = False
