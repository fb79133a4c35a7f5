"""Accelerate's tracker interface (``accelerate.tracking``) on drivetrain's loggers.

An Accelerate program adds its own experiment tracker by subclassing :class:`GeneralTracker`
(``name``, ``requires_logging_directory``, a ``tracker`` property, ``store_init_configuration``,
``log``, ``finish``) and passing an instance in ``Accelerator(log_with=[MyTracker(...)])``. Such a
tracker is used as it is. The built-in trackers (:class:`TensorBoardTracker`, :class:`WandBTracker`,
:class:`MLflowTracker`) are thin faces of drivetrain's loggers (:mod:`drivetrain.loggers`): each
holds the logger that does the writing (``tracker.logger``), so a run logged through
``Accelerator(log_with="tensorboard")`` and ``Trainer(logger="tensorboard")`` is written by the same
code. Attributes a tracker lacks are looked up on its logger (``get_tracker("mlflow").run_id``).

``LOGGER_TYPE_TO_CLASS`` maps tracker names to classes as in Accelerate; a user's class added
there (or with :func:`register_tracker_class`) is built by name like a built-in one.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from drivetrain._utilities.log import get_logger
from drivetrain._utilities.rank_zero import global_rank
from drivetrain.loggers.logger import DEFAULT_EXPERIMENT, Logger
from drivetrain.loggers.mlflow import MLFlowLogger
from drivetrain.loggers.registry import logger_kind
from drivetrain.loggers.tensorboard import TensorBoardLogger
from drivetrain.loggers.wandb import WandbLogger

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "GeneralTracker",
    "LoggerTracker",
    "MLflowTracker",
    "TensorBoardTracker",
    "WandBTracker",
    "flatten_values",
    "on_main_process",
    "register_tracker_class",
    "tracker_for_logger",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_log = get_logger(__name__)


def on_main_process(function: _F) -> _F:
    """For a tracker's methods: run only on the main process when the tracker's ``main_process_only`` is true.

    The main process is global rank 0 as the launcher announced it, read when the method is called.
    """

    @functools.wraps(function)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False) and global_rank() != 0:
            return None
        return function(self, *args, **kwargs)

    return method  # type: ignore[return-value]


class GeneralTracker:
    """The base class of experiment trackers for ``Accelerator(log_with=...)`` (Accelerate's interface).

    A subclass defines ``name`` (a string naming the tracker, for ``get_tracker(name)``),
    ``requires_logging_directory`` (whether it writes under the Accelerator's ``logging_dir``) and a
    ``tracker`` property (the object it writes through), and overrides what it needs of
    :meth:`start`, :meth:`store_init_configuration`, :meth:`log` and :meth:`finish`. The
    Accelerator calls them on the main process only. ``main_process_only`` is for the tracker's own
    methods decorated with :func:`on_main_process`.

    Example:
        >>> class Printer(GeneralTracker):
        ...     name = "printer"
        ...     requires_logging_directory = False
        ...     @property
        ...     def tracker(self):
        ...         return print
        ...     def log(self, values, step=None, **kwargs):
        ...         print(step, values)
        >>> Printer().log({"loss": 0.5}, step=1)
        1 {'loss': 0.5}

    Raises:
        NotImplementedError: (on construction) a subclass without ``name``,
            ``requires_logging_directory`` or ``tracker``.
    """

    #: Whether methods decorated with :func:`on_main_process` run on the main process only.
    main_process_only: bool = True
    # Declared for type checkers only: a subclass must define them (checked on construction).
    name: str
    requires_logging_directory: bool

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [
            f"`{attribute}`"
            for attribute in ("name", "requires_logging_directory")
            if not hasattr(type(self), attribute) and attribute not in vars(self)
        ]
        if "tracker" not in dir(self):
            missing.append("`tracker`")
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} misses {', '.join(missing)}: a GeneralTracker subclass defines `name` (a "
                f"string), `requires_logging_directory` (a bool) and a `tracker` property in its class body."
            )

    def start(self) -> None:
        """Start the run (called by ``init_trackers``, before :meth:`store_init_configuration`)."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record ``values`` as the run's hyperparameters (``init_trackers(config=...)``)."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step`` (``accelerator.log``; ``kwargs`` from its ``log_kwargs[name]``)."""

    def finish(self) -> None:
        """End the run (``end_training``)."""


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


class LoggerTracker(GeneralTracker):
    """A :class:`GeneralTracker` that writes through a drivetrain :class:`~drivetrain.loggers.Logger`.

    What ``Accelerator(log_with=...)`` makes of a logger name without a tracker class of its own
    (``"csv"``, a name registered in ``LoggerRegistry``) and of a ``Logger`` instance. The logger is
    ``self.logger``; attributes the tracker lacks are the logger's (``log_dir``, ``run_id`` …).

    Args:
        logger: the logger that writes.
        name: the tracker's name (default: the logger's registered name, else its class name).
    """

    requires_logging_directory = False

    def __init__(self, logger: Logger, name: str | None = None) -> None:
        if not isinstance(logger, Logger):
            raise TypeError(
                f"{type(self).__name__} wraps a drivetrain.loggers.Logger, got {type(logger).__name__}."
            )
        self.logger = logger
        if name is not None or not hasattr(type(self), "name"):
            self.name = name or logger_kind(logger) or type(logger).__name__
        super().__init__()

    @classmethod
    def from_logger(cls, logger: Logger) -> LoggerTracker:
        """This tracker class around a logger that is built already (what resolving ``log_with`` does)."""
        tracker = cls.__new__(cls)
        LoggerTracker.__init__(tracker, logger)
        return tracker

    @property
    def tracker(self) -> Any:
        """What the logger writes through (its ``experiment``: the ``SummaryWriter``, the W&B run …)."""
        return getattr(self.logger, "experiment", None)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.logger.log_hyperparams(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record numbers and one-element tensors (nested dicts as ``outer/inner``) at ``step``.

        Raises:
            TypeError: keyword arguments (this tracker takes none) or values of another kind.
        """
        if kwargs:
            raise TypeError(
                f"The {self.name!r} tracker takes no log keyword arguments (got {sorted(kwargs)}); leave them out "
                f"of log_kwargs."
            )
        self.logger.log_metrics(flatten_values(values), step)

    def finish(self) -> None:
        self.logger.finish("success")

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") or attribute == "logger":
            raise AttributeError(attribute)
        return getattr(self.logger, attribute)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, logger={type(self.logger).__name__})"


def _split_text(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    flat = flatten_values(values)
    text = {key: value for key, value in flat.items() if isinstance(value, str)}
    return {key: value for key, value in flat.items() if key not in text}, text


class TensorBoardTracker(LoggerTracker):
    """TensorBoard event files (Accelerate's tracker), written by :class:`~drivetrain.loggers.TensorBoardLogger`.

    Args:
        run_name: the experiment (``init_trackers``' ``project_name``).
        logging_dir: the folder; the events go to ``logging_dir/run_name/version_N``.
        **kwargs: passed to ``SummaryWriter`` (``flush_secs`` …).
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:

        super().__init__(
            TensorBoardLogger.for_experiment(save_dir=os.fspath(logging_dir), experiment=run_name, **kwargs)
        )

    @property
    def writer(self) -> Any:
        """The ``SummaryWriter``."""
        return self.tracker

    @property
    def run_name(self) -> str:
        return str(self.logger.name)

    @property
    def logging_dir(self) -> str | None:
        """The run's folder (``logging_dir/run_name/version_N``)."""
        return self.logger.log_dir

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as scalars and strings as text, at ``step``; nested dicts as ``outer/inner``."""
        numbers, text = _split_text(values)
        super().log(numbers, step, **kwargs)
        if text and global_rank() == 0:
            for key, value in text.items():
                self.writer.add_text(key, value, global_step=step)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``SummaryWriter.add_images`` for each ``name: images`` of ``values``."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)


class WandBTracker(LoggerTracker):
    """A Weights & Biases run (Accelerate's tracker), written by :class:`~drivetrain.loggers.WandbLogger`.

    Args:
        run_name: the W&B project (``init_trackers``' ``project_name``).
        **kwargs: passed to ``wandb.init`` (``entity``, ``tags``, ``name`` …).
    """

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:

        super().__init__(WandbLogger.for_experiment(save_dir=None, experiment=run_name, **kwargs))

    @property
    def run(self) -> Any:
        """The ``wandb`` run."""
        return self.tracker

    @property
    def run_name(self) -> str:
        return str(self.logger.name)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each ``name: images`` of ``values`` as a list of ``wandb.Image``."""
        import wandb

        self.log(
            {key: [wandb.Image(image) for image in images] for key, images in values.items()}, step, **kwargs
        )

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """A ``wandb.Table`` from ``columns`` and ``data``, or from ``dataframe``."""
        import wandb

        table = wandb.Table(columns=columns, data=data, dataframe=dataframe)  # type: ignore[arg-type]
        self.log({table_name: table}, step, **kwargs)


class MLflowTracker(LoggerTracker):
    """An MLflow run (Accelerate's tracker), written by :class:`~drivetrain.loggers.MLFlowLogger`.

    Args:
        experiment_name: the MLflow experiment (``init_trackers``' ``project_name``).
        logging_dir: the folder of the local store (``logging_dir/mlruns``) unless
            ``MLFLOW_TRACKING_URI`` names one; default ``./mlruns``.
        run_id: log into this run instead of starting one.
        tags: tags of the new run (a dict, or its JSON text).
        nested_run: must stay ``False``: drivetrain's MLflow runs are not nested.
        run_name: the run's name.
        description: the run's description.

    ``tracker`` is the ``MlflowClient``; ``active_run`` the run (``active_run.info.run_id``).
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: Mapping[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:

        if nested_run:
            raise ValueError(
                "MLflowTracker(nested_run=True) is not supported: drivetrain's MLflow runs are top-level runs. Leave "
                "nested_run out."
            )
        parsed = json.loads(tags) if isinstance(tags, str) else dict(tags or {})
        if description is not None:
            parsed["mlflow.note.content"] = description  # where MLflow keeps a run's description
        options: dict[str, Any] = {"run_name": run_name, "tags": parsed, "run_id": run_id}
        super().__init__(
            MLFlowLogger.for_experiment(
                save_dir=os.fspath(logging_dir) if logging_dir is not None else None,
                experiment=experiment_name or DEFAULT_EXPERIMENT,
                **options,
            )
        )

    @property
    def active_run(self) -> Any:
        """The MLflow run (``mlflow.entities.Run``)."""
        return self.tracker.get_run(self.logger.version)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers at ``step``; other values are left out with a warning, as MLflow records numbers only."""
        numbers, text = _split_text(values)
        for key in text:
            _log.warning_once(
                f"MLflowTracker leaves out {key!r}: MLflow metrics are numbers, and it is a string."
            )
        super().log(numbers, step, **kwargs)


_BUILTIN_TRACKERS: dict[str, type[LoggerTracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "mlflow": MLflowTracker,
}

#: Tracker name -> class (Accelerate's table). A user's class added here (or with
#: :func:`register_tracker_class`) is built by name: ``cls(project_name, [logging_dir], **init_kwargs)``.
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = dict(_BUILTIN_TRACKERS)


def custom_tracker_class(name: str) -> type[GeneralTracker] | None:
    """The user's tracker class ``name`` stands for in :data:`LOGGER_TYPE_TO_CLASS`, if it is not a built-in one."""
    found = LOGGER_TYPE_TO_CLASS.get(name)
    if found is None or found is _BUILTIN_TRACKERS.get(name):
        return None
    return found


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with=tracker_class.name`` build ``tracker_class`` (as Accelerate's function does).

    Raises:
        ValueError: not a :class:`GeneralTracker` subclass, or without ``name`` or
            ``requires_logging_directory``.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class expects a GeneralTracker subclass, got {tracker_class!r}.")
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{tracker_class.__name__} needs a non-empty `name` class attribute to be registered."
        )
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(
            f"{tracker_class.__name__} needs a `requires_logging_directory` class attribute (True when it writes "
            f"under the Accelerator's logging_dir, else False)."
        )
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"register_tracker_class: {tracker_class.__name__} replaces {LOGGER_TYPE_TO_CLASS[name].__name__} as "
            f"the tracker named {name!r}.",
            UserWarning,
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def tracker_for_logger(logger: Logger) -> LoggerTracker:
    """The tracker for a built logger: the built-in tracker class of its kind, else a :class:`LoggerTracker`."""
    cls = _BUILTIN_TRACKERS.get(logger_kind(logger) or "", LoggerTracker)
    return cls.from_logger(logger)
