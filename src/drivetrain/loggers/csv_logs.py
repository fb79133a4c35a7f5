"""Log metrics to a CSV file and hyperparameters to a YAML file, on the local file system.

Files go to ``save_dir/name/version_N/``: ``metrics.csv`` (one row per logging call, a ``step``
column and one column per metric; new metrics widen the table) and ``hparams.yaml``.
"""

from __future__ import annotations

import csv
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drivetrain.loggers.logger import (
    DEFAULT_EXPERIMENT,
    FolderLogger,
    metrics_to_floats,
    params_to_dict,
    plain_value,
    rank_zero_experiment,
)
from drivetrain.loggers.plot import plot_run
from drivetrain.loggers.registry import LoggerRegistry

METRICS_FILE = "metrics.csv"
HPARAMS_FILE = "hparams.yaml"


class CSVLogger(FolderLogger):
    """Write metrics to ``metrics.csv`` and hyperparameters to ``hparams.yaml``.

    Args:
        save_dir: the root folder.
        name: the experiment's folder under ``save_dir`` (``None`` or ``""``: none).
        version: ``None`` picks the next free ``version_N``; an int ``N`` means ``version_N``;
            a string is used as the folder name.
        prefix: put in front of every metric name.
        flush_logs_every_n_steps: buffer this many ``log_metrics`` calls before writing.

    Example:
        >>> logger = CSVLogger("runs", name="digits")  # doctest: +SKIP
        >>> logger.log_metrics({"loss": 0.25}, step=10)  # doctest: +SKIP
        >>> logger.finalize("success")  # doctest: +SKIP
    """

    def __init__(
        self,
        save_dir: str | Path,
        name: str | None = DEFAULT_EXPERIMENT,
        version: int | str | None = None,
        *,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        if isinstance(flush_logs_every_n_steps, bool) or not isinstance(flush_logs_every_n_steps, int):
            raise TypeError(f"flush_logs_every_n_steps= expects an int, got {flush_logs_every_n_steps!r}.")
        if flush_logs_every_n_steps < 1:
            raise ValueError(f"flush_logs_every_n_steps={flush_logs_every_n_steps}; use 1 or more.")
        super().__init__(save_dir, name, version, prefix)
        self._flush_every = flush_logs_every_n_steps
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._hparams: dict[str, Any] = {}
        self._written_rows = 0

    @property
    def metrics_file_path(self) -> str:
        return self.file_path(METRICS_FILE)

    @property
    @rank_zero_experiment
    def experiment(self) -> CSVExperiment:
        """The writer behind the files, as Lightning's ``ExperimentWriter``: ``log_metrics``, ``log_hparams``,
        ``save``, ``metrics`` (rows not written yet), ``metrics_file_path``, ``log_dir``."""
        return CSVExperiment(self)

    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None) -> None:
        """Merge ``params`` into ``hparams.yaml`` (written at once)."""
        params = params_to_dict(params)
        if not self._writes_here():
            return
        self._hparams.update(plain_value(params))
        self.write_hparams(self._hparams, HPARAMS_FILE)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Buffer a row of ``metrics`` at ``step``; rows are written every ``flush_logs_every_n_steps`` calls."""
        values = metrics_to_floats(metrics)
        if not self._writes_here():
            return
        row: dict[str, Any] = {f"{self._prefix}{k}": v for k, v in values.items()}
        row["step"] = step if step is not None else len(self._rows) + self._written_rows
        self._rows.append(row)
        if len(self._rows) >= self._flush_every:
            self.save()

    def save(self) -> None:
        """Write the buffered rows to ``metrics.csv``."""
        if not self._rows or not self._writes_here():
            return
        self.make_log_dir()
        new_columns = [k for row in self._rows for k in row if k not in self._columns]
        exists = self.file_exists(METRICS_FILE)
        if new_columns or not exists:
            # The header must name every column, so a wider table means rewriting the file.
            previous = self._read_rows() if self._columns and exists else []
            self._columns = _ordered_columns(self._columns, new_columns)
            with self.open_file(METRICS_FILE, "w") as file:
                writer = csv.DictWriter(file, fieldnames=self._columns)
                writer.writeheader()
                writer.writerows(previous)
                writer.writerows(self._rows)
        else:
            with self.open_file(METRICS_FILE, "a") as file:
                csv.DictWriter(file, fieldnames=self._columns).writerows(self._rows)
        self._written_rows += len(self._rows)
        self._rows = []

    def _read_rows(self) -> list[dict[str, str]]:
        with self.open_file(METRICS_FILE) as file:
            return list(csv.DictReader(file))

    def finalize(self, status: str) -> None:
        self.save()

    def plot(self, output: str | Path | None = None) -> str | None:
        """Write a PNG of the logged curves (default ``log_dir/metrics.png``; needs ``drivetrain[plot]``).

        One axis per metric group (``train_loss``, ``val_loss`` … share ``loss``), by step, with the
        epochs along the top. Returns the PNG's path; ``None`` on ranks other than 0, which log nothing.
        """
        if not self._writes_here():
            return None
        self.save()

        return plot_run(self.log_dir, output).path


class CSVExperiment:
    """:attr:`CSVLogger.experiment`: the logger's files under the names Lightning's ``ExperimentWriter`` has."""

    def __init__(self, logger: CSVLogger) -> None:
        self._logger = logger

    @property
    def log_dir(self) -> str:
        return self._logger.log_dir

    @property
    def metrics_file_path(self) -> str:
        return self._logger.metrics_file_path

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows logged and not written yet (``save`` writes them)."""
        return self._logger._rows

    @property
    def metrics_keys(self) -> list[str]:
        """The columns of ``metrics.csv`` so far."""
        return list(self._logger._columns)

    @property
    def hparams(self) -> dict[str, Any]:
        return self._logger._hparams

    def log_metrics(self, metrics_dict: Mapping[str, Any], step: int | None = None) -> None:
        self._logger.log_metrics(metrics_dict, step)

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        self._logger.log_hyperparams(params)

    def save(self) -> None:
        self._logger.save()


LoggerRegistry.register(
    "csv", CSVLogger, description="metrics.csv and hparams.yaml under save_dir/name/version_N"
)


def _ordered_columns(existing: list[str], new: list[str]) -> list[str]:
    seen = dict.fromkeys(existing + new)
    seen.pop("step", None)
    return ["step", *sorted(seen)]
