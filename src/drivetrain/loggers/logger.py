"""The experiment-logger interface, and the helpers every logger shares.

A logger receives scalar metrics (``log_metrics``) and the run's hyperparameters
(``log_hyperparams``) and writes them somewhere. Loggers write from global rank 0 only: the
Trainer calls them there alone, and the write methods of the built-in loggers also check the
rank the launcher announced, so a front door that calls them on every rank still writes once.
On other ranks :attr:`Logger.experiment` is a stand-in that accepts every call and records
nothing, so ``self.logger.experiment.add_image(...)`` in a module runs unchanged on every rank.

Both front doors build loggers named by a string (``Trainer(logger="wandb")``,
``Accelerator(log_with="mlflow")``) through :meth:`Logger.for_experiment` (see
:mod:`drivetrain.loggers.resolve`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
from abc import ABC, abstractmethod
from argparse import Namespace
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

import torch

from drivetrain._utilities import imports, paths
from drivetrain._utilities.rank_zero import global_rank

__all__ = [
    "DEFAULT_EXPERIMENT",
    "DummyLogger",
    "Logger",
    "NoExperiment",
    "flatten_params",
    "metrics_to_floats",
    "next_version",
    "params_to_dict",
    "rank_zero_experiment",
]

_F = TypeVar("_F", bound=Callable[..., Any])

#: The experiment name loggers get when nobody names one (the Trainer's ``drivetrain_logs`` folder).
DEFAULT_EXPERIMENT = "drivetrain_logs"


class NoExperiment:
    """What :attr:`Logger.experiment` is on ranks other than 0: every attribute and call is accepted and ignored."""

    def __getattr__(self, name: str) -> NoExperiment:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> NoExperiment:
        return self

    def __getitem__(self, key: Any) -> NoExperiment:
        return self

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NoExperiment()"


def rank_zero_experiment(getter: _F) -> _F:
    """For an ``experiment`` property: the real object on global rank 0, a :class:`NoExperiment` elsewhere."""

    @functools.wraps(getter)
    def experiment(self: Any) -> Any:
        if global_rank() != 0:
            return NoExperiment()
        return getter(self)

    return experiment  # type: ignore[return-value]


class Logger(ABC):
    """Base class of experiment loggers.

    Subclasses implement :attr:`name`, :attr:`version`, :meth:`log_metrics` and
    :meth:`log_hyperparams`; :meth:`save`, :meth:`finalize` and
    :meth:`after_save_checkpoint` have no-op defaults.

    A logger that needs a package declares it in :attr:`requirement` (``("wandb", "wandb")``: the
    module and the ``drivetrain[...]`` extra that installs it); naming such a logger where the
    package is missing is an error that says what to install.
    """

    #: ``(module, extra)``: the package this logger needs and the drivetrain extra that installs it.
    requirement: ClassVar[tuple[str, str] | None] = None
    #: Whether a logger built by name needs a folder to write into (``project_dir`` for the Accelerator).
    needs_save_dir: ClassVar[bool] = False

    @classmethod
    def is_available(cls) -> bool:
        """Whether the package this logger needs is installed."""
        return cls.requirement is None or imports.package_available(cls.requirement[0])

    @classmethod
    def check_available(cls) -> None:
        """Raise an ImportError naming the extra to install when :meth:`is_available` is false."""
        if cls.requirement is not None:
            module, extra = cls.requirement
            imports.require(module, extra=extra, feature=cls.__name__)

    @classmethod
    def for_experiment(cls, *, save_dir: str | None, experiment: str, **options: Any) -> Logger:
        """Build the logger a front door names: ``Trainer(logger="csv")`` or ``accelerator.init_trackers(name)``.

        Args:
            save_dir: the door's folder for logs (``default_root_dir``; the Accelerator's ``logging_dir``).
            experiment: the experiment (project) name: ``"drivetrain_logs"`` for the Trainer, the
                ``project_name`` of ``init_trackers``.
            **options: the logger's own constructor arguments (``init_kwargs={"csv": {...}}``).

        The default passes ``save_dir`` and ``name=experiment`` to the constructor, as far as it takes
        them; a logger whose constructor names them differently overrides this.
        """
        parameters = inspect.signature(cls).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        given = {"save_dir": save_dir, "name": experiment}
        kwargs = {k: v for k, v in given.items() if (k in parameters or takes_any) and k not in options}
        return cls(**kwargs, **options)

    @property
    @abstractmethod
    def name(self) -> str | None:
        """The experiment name (the folder under :attr:`save_dir`)."""

    @property
    @abstractmethod
    def version(self) -> int | str | None:
        """The run's version within the experiment."""

    @property
    def save_dir(self) -> str | None:
        """The root folder the logger writes under, if it writes files."""
        return None

    @property
    def log_dir(self) -> str | None:
        """The folder of this run (``save_dir/name/version_N``), if the logger writes files."""
        return None

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record scalar ``metrics`` at ``step``."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace) -> None:
        """Record the run's hyperparameters."""

    def save(self) -> None:
        """Flush what is buffered."""

    def finalize(self, status: str) -> None:
        """Finish the run (``status`` is ``"success"``, ``"failed"`` or ``"aborted"``); flushes by default."""
        self.save()

    def finish(self, status: str = "success") -> None:
        """End the run for good (the Accelerator's ``end_training``); by default the same as :meth:`finalize`.

        :meth:`finalize` ends one Trainer entry point, after which ``test`` may still log into the
        same run; trackers whose runs must be closed explicitly (W&B) close them here.
        """
        self.finalize(status)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called after a checkpoint was written (loggers that upload checkpoints override it)."""

    @staticmethod
    def _writes_here() -> bool:
        return global_rank() == 0


class DummyLogger(Logger):
    """The logger ``Trainer(fast_dev_run=...)`` puts in place of the configured ones (Lightning's): it records
    nothing, and accepts every call, so ``self.logger.experiment.add_image(...)`` or ``self.logger[0]`` in a
    module runs unchanged in a smoke run."""

    @property
    def experiment(self) -> NoExperiment:
        return NoExperiment()

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_hyperparams(self, params: Mapping[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        pass

    def __getitem__(self, index: int) -> DummyLogger:
        return self  # ``self.logger[0]`` where a list of loggers was expected

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):  # copy, pickle and friends look for dunder methods: say there are none
            raise AttributeError(name)

        def ignored(*args: Any, **kwargs: Any) -> None:
            return None

        return ignored


class FolderLogger(Logger):
    """A logger writing into ``save_dir/name/version_N``: the folder handling the file loggers share."""

    needs_save_dir = True

    def __init__(
        self, save_dir: str | Path, name: str | None, version: int | str | None, prefix: str
    ) -> None:
        if not isinstance(save_dir, (str, Path)):
            raise TypeError(f"save_dir= expects a path, got {type(save_dir).__name__} ({save_dir!r}).")
        self._save_dir = paths.normalize(save_dir)
        paths.check(self._save_dir)  # an s3:// folder without s3fs is reported here, not at the first write
        self._name = name or ""
        self._version = check_version(version)
        self._prefix = prefix

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = next_version(paths.join(self._save_dir, self._name))
        return self._version

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def root_dir(self) -> str:
        """``save_dir/name``: where the versions of this experiment live."""
        return paths.join(self._save_dir, self._name)

    @property
    def log_dir(self) -> str:
        return run_directory(self._save_dir, self._name, self.version)

    # -- files in the run folder: every file a folder logger touches goes through these. A
    # -- ``save_dir`` with a scheme (s3://...) is remote storage, reached through fsspec.
    def file_path(self, name: str) -> str:
        """The path of the file ``name`` in :attr:`log_dir`."""
        return paths.join(self.log_dir, name)

    def make_log_dir(self) -> None:
        """Create :attr:`log_dir` (and its parents) if missing."""
        paths.makedirs(self.log_dir)

    def file_exists(self, name: str) -> bool:
        return paths.exists(self.file_path(name))

    def open_file(self, name: str, mode: str = "r") -> IO[Any]:
        """Open ``name`` in :attr:`log_dir` (text modes with ``newline=""``, as the csv module wants)."""
        if "b" in mode:
            return paths.open_file(self.file_path(name), mode)
        return paths.open_file(self.file_path(name), mode, newline="")

    def write_file_atomically(self, name: str, text: str) -> None:
        """Replace ``name`` with ``text`` in one step: readers see the old content or the new, never half."""
        self.make_log_dir()
        path = self.file_path(name)
        if paths.is_remote(path):
            with paths.open_file(path, "w") as file:  # an object appears whole when its upload completes
                file.write(text)
            return
        tmp = f"{path}.tmp"
        with open(tmp, "w") as file:
            file.write(text)
        os.replace(tmp, path)

    def write_hparams(self, params: Mapping[str, Any], name: str = "hparams.yaml") -> None:
        """Write ``params`` as YAML to ``name`` in :attr:`log_dir`."""
        import yaml

        self.write_file_atomically(name, yaml.safe_dump(dict(params), sort_keys=False))


def next_version(root: str | Path) -> int:
    """The first ``N`` such that ``root/version_N`` does not exist yet (0 for a new experiment); local or remote."""
    if not paths.isdir(root):
        return 0
    taken = []
    for entry in paths.listdir(root):
        match = re.fullmatch(r"version_(\d+)", entry)
        if match and paths.isdir(paths.join(root, entry)):
            taken.append(int(match.group(1)))
    return max(taken) + 1 if taken else 0


def run_directory(save_dir: str | Path, name: str | None, version: int | str) -> str:
    """``save_dir/name/version_N`` (``version`` as given when it is a string)."""
    folder = version if isinstance(version, str) else f"version_{version}"
    parts = ([name] if name else []) + [folder]
    return paths.join(save_dir, *parts)


def check_version(version: Any) -> int | str | None:
    if (
        version is None
        or isinstance(version, str)
        or (isinstance(version, int) and not isinstance(version, bool))
    ):
        if isinstance(version, int) and version < 0:
            raise ValueError(
                f"version={version} is negative; use a version number >= 0, a folder name, or None."
            )
        return version
    raise TypeError(
        f"version= expects None (the next free version), an int or a folder name, got {type(version).__name__} "
        f"({version!r})."
    )


def params_to_dict(params: Any) -> dict[str, Any]:
    """Hyperparameters as a plain dict: accepts mappings, ``argparse.Namespace`` and dataclasses."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        return dict(vars(params))
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        return dataclasses.asdict(params)
    if isinstance(params, Mapping):
        return dict(params)
    raise TypeError(
        f"log_hyperparams expects a dict, an argparse.Namespace or a dataclass instance, got "
        f"{type(params).__name__} ({params!r})."
    )


def plain_value(value: Any) -> Any:
    """A value a YAML/JSON file can hold: nested containers kept, other objects by their ``str``."""
    if isinstance(value, Namespace):
        value = vars(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def flatten_params(params: Mapping[str, Any], separator: str = "/") -> dict[str, Any]:
    """Flatten nested mappings into ``outer/inner`` keys with plain scalar values."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        value = plain_value(value)
        if isinstance(value, dict) and value:
            for inner, inner_value in flatten_params(value, separator).items():
                flat[f"{key}{separator}{inner}"] = inner_value
        else:
            flat[str(key)] = value
    return flat


def metrics_to_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Check and convert logged values (numbers or one-element tensors) to floats; Python ints stay ints.

    Ints (``epoch``, counts) keep their type so a CSV shows ``3``, not ``3.0``.
    """
    converted: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"The metric {key!r} is a tensor of shape {tuple(value.shape)}; loggers record scalars. "
                    f"Reduce it first (e.g. .mean()) or log its elements under separate names."
                )
            converted[key] = float(value.item())
        elif isinstance(value, int) and not isinstance(value, bool):
            converted[key] = value
        elif isinstance(value, (float, bool)):
            converted[key] = float(value)
        else:
            raise TypeError(
                f"The metric {key!r} has the value {value!r} of type {type(value).__name__}; loggers record "
                f"numbers and one-element tensors."
            )
    return converted
