"""Log metrics and hyperparameters as TensorBoard event files.

Needs the ``tensorboard`` package (``pip install 'drivetrain[tensorboard]'``): a missing package
is reported, with the extra to install, when the logger is constructed or named; the package is
imported when the first event is written.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drivetrain.loggers.csv_logs import HPARAMS_FILE
from drivetrain.loggers.logger import (
    DEFAULT_EXPERIMENT,
    FolderLogger,
    flatten_params,
    metrics_to_floats,
    params_to_dict,
    plain_value,
    rank_zero_experiment,
)
from drivetrain.loggers.registry import LoggerRegistry


class TensorBoardLogger(FolderLogger):
    """Write TensorBoard event files to ``save_dir/name/version_N``.

    Args:
        save_dir: the root folder (``tensorboard --logdir save_dir`` shows every run).
        name: the experiment's folder under ``save_dir`` (``None`` or ``""``: none).
        version: ``None`` picks the next free ``version_N``; an int ``N`` means ``version_N``;
            a string is used as the folder name.
        prefix: put in front of every metric name.
        **writer_kwargs: passed to ``torch.utils.tensorboard.SummaryWriter`` (``flush_secs`` …).

    Hyperparameters go to TensorBoard's HParams dashboard and to ``hparams.yaml``.
    """

    requirement = ("tensorboard", "tensorboard")

    def __init__(
        self,
        save_dir: str | Path,
        name: str | None = DEFAULT_EXPERIMENT,
        version: int | str | None = None,
        *,
        prefix: str = "",
        **writer_kwargs: Any,
    ) -> None:
        self.check_available()
        super().__init__(save_dir, name, version, prefix)
        self._writer_kwargs = writer_kwargs
        self._writer: Any = None
        self._hparams: dict[str, Any] = {}

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``SummaryWriter`` (created on first use on global rank 0), for anything beyond scalars."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.make_log_dir()
            self._writer = SummaryWriter(log_dir=self.log_dir, **self._writer_kwargs)
        return self._writer

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = metrics_to_floats(metrics)
        if not self._writes_here():
            return
        writer = self.experiment
        for key, value in values.items():
            writer.add_scalar(f"{self._prefix}{key}", value, step)

    def log_hyperparams(
        self, params: Mapping[str, Any] | Namespace | None = None, metrics: Mapping[str, Any] | None = None
    ) -> None:
        """Record ``params`` for the HParams dashboard (with optional ``metrics`` to compare runs by)."""
        params = params_to_dict(params)
        if not self._writes_here():
            return
        self._hparams.update(plain_value(params))
        writer = self.experiment
        self.write_hparams(self._hparams, HPARAMS_FILE)
        from torch.utils.tensorboard.summary import hparams

        flat = {
            k: (v if isinstance(v, (bool, int, float, str)) else str(v))
            for k, v in flatten_params(self._hparams).items()
        }
        metric_values = metrics_to_floats(metrics or {})
        for summary in hparams(flat, metric_values):
            writer.file_writer.add_summary(summary)
        for key, value in metric_values.items():
            writer.add_scalar(key, value, 0)

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    def __getstate__(self) -> dict[str, Any]:
        # The writer holds an open file and a thread; a copy in another process opens its own.
        state = dict(self.__dict__)
        state["_writer"] = None
        return state


LoggerRegistry.register(
    "tensorboard", TensorBoardLogger, description="TensorBoard event files under save_dir/name/version_N"
)
