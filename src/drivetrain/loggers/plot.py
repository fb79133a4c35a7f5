"""A PNG of a run's logged curves: ``drivetrain plot RUN_DIR`` and :meth:`CSVLogger.plot`.

The run is read from ``metrics.csv`` (:class:`~drivetrain.loggers.CSVLogger`) or, when there is
none, from TensorBoard event files (:class:`~drivetrain.loggers.TensorBoardLogger`). Metrics are
grouped by what they measure, one axis per group: ``train_loss_step``, ``train_loss_epoch`` and
``val_loss`` share the ``loss`` axis, ``val_acc`` and ``train_acc`` the ``acc`` axis. Every curve is
drawn against the step; dotted lines mark where each epoch starts. Needs matplotlib
(``pip install 'drivetrain[plot]'``); the figure is drawn off screen (no GUI, no pyplot state).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from drivetrain._utilities import paths
from drivetrain._utilities.imports import require

__all__ = ["PlotResult", "build_figure", "metric_group", "plot_run", "read_run"]

METRICS_FILE = "metrics.csv"
PLOT_FILE = "metrics.png"
#: The PNG text key under which the plot records its groups (``{"loss": ["train_loss", "val_loss"]}``).
GROUPS_KEY = "drivetrain:metric-groups"

_STAGE_PREFIXES = (
    "train_",
    "training_",
    "val_",
    "validation_",
    "test_",
    "train/",
    "val/",
    "validation/",
    "test/",
)
_NOT_METRICS = ("step", "epoch")


def metric_group(name: str, names: Sequence[str] = ()) -> str:
    """What a metric measures: its name without stage prefix, loader suffix and ``_step``/``_epoch``.

    The ``_step``/``_epoch`` suffix goes only when its counterpart is among ``names`` (the Trainer adds
    both when a value is logged both ways): a metric named ``only_step`` alone keeps its name.
    """
    base = name.split("/dataloader_idx_")[0]
    for suffix, other in (("_step", "_epoch"), ("_epoch", "_step")):
        if base.endswith(suffix) and (not names or name[: -len(suffix)] + other in names):
            base = base[: -len(suffix)]
            break
    for prefix in _STAGE_PREFIXES:
        if base.startswith(prefix) and len(base) > len(prefix):
            return base[len(prefix) :]
    return base


def _number(text: str) -> float | None:
    if text in ("", None):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def read_run(run: str | os.PathLike[str]) -> list[dict[str, float]]:
    """A run's logged rows (``step``, ``epoch`` when logged, and the metrics), from a folder or a ``metrics.csv``.

    Raises:
        FileNotFoundError: neither ``metrics.csv`` nor TensorBoard event files are there.
    """
    path = paths.normalize(run)
    csv_path = path if paths.isfile(path) else paths.join(path, METRICS_FILE)
    if paths.isfile(csv_path):
        with paths.open_file(csv_path, "r", newline="") as file:
            rows = [
                {k: v for k, v in ((k, _number(v)) for k, v in row.items()) if v is not None}
                for row in csv.DictReader(file)
            ]
        return [row for row in rows if "step" in row]
    if paths.isdir(path) and any(name.startswith("events.out.tfevents.") for name in paths.listdir(path)):
        return _read_events(path)
    raise FileNotFoundError(
        f"No logged metrics in '{run}': expected a metrics.csv (CSVLogger) or TensorBoard event files "
        f"(TensorBoardLogger) there. Pass the run's folder, e.g. drivetrain_logs/version_0."
    )


def _read_events(folder: str) -> list[dict[str, float]]:
    require("tensorboard", extra="tensorboard", feature="Plotting TensorBoard event files")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(
        folder, size_guidance={"scalars": 0}
    )  # TensorBoard reads URLs through fsspec
    accumulator.Reload()
    by_step: dict[int, dict[str, float]] = {}
    rows: list[dict[str, float]] = []
    for tag in accumulator.Tags().get("scalars", []):
        for event in accumulator.Scalars(tag):
            row = by_step.get(event.step)
            if row is None:
                row = by_step[event.step] = {"step": float(event.step)}
                rows.append(row)
            row[tag] = float(event.value)
    return sorted(rows, key=lambda row: row["step"])


def group_metrics(rows: Sequence[dict[str, float]]) -> dict[str, list[str]]:
    """Metric names by group: the loss group first, then by name; training, validation, test within each."""
    names = sorted({name for row in rows for name in row if name not in _NOT_METRICS}, key=_stage_order)
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(metric_group(name, names), []).append(name)
    # Losses first (what people look at), then the other groups by name.
    return dict(sorted(groups.items(), key=lambda item: (item[0] != "loss", item[0])))


def _stage_order(name: str) -> tuple[int, str]:
    stages = ("train", "val", "test")
    stage = next((i for i, s in enumerate(stages) if name.startswith(s)), len(stages))
    return stage, name


def build_figure(rows: Sequence[dict[str, float]], title: str = "") -> tuple[Any, dict[str, list[str]]]:
    """A matplotlib ``Figure`` with one axis per metric group, and the groups (axis title → metrics)."""
    require("matplotlib", extra="plot", feature="drivetrain plot")
    from matplotlib.figure import Figure

    groups = group_metrics(rows)
    if not groups:
        raise ValueError("The run logged no metrics to plot (only steps and epochs).")
    columns = min(2, len(groups))
    lines = math.ceil(len(groups) / columns)
    figure = Figure(figsize=(6.4 * columns, 3.6 * lines), layout="constrained")
    if title:
        figure.suptitle(title)
    epochs = [(row["step"], row["epoch"]) for row in rows if "epoch" in row]
    for index, (group, names) in enumerate(groups.items()):
        axis = figure.add_subplot(lines, columns, index + 1)
        for name in names:
            points = [(row["step"], row[name]) for row in rows if name in row]
            # Few points (epoch values, validation) get markers so a single point still shows.
            marker = "o" if len(points) <= 50 else None
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=marker, markersize=3, label=name)
        axis.set_title(group)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
        if len(epochs) > 1:
            _epoch_axis(axis, epochs)
    return figure, groups


def _epoch_axis(axis: Any, epochs: list[tuple[float, float]]) -> None:
    """Where each epoch starts: a dotted line at its first logged step, labelled along the top."""
    first: dict[float, float] = {}
    for step, epoch in sorted(epochs):
        first.setdefault(epoch, step)
    low, high = axis.get_xlim()
    for epoch, step in first.items():
        if low <= step <= high:
            axis.axvline(step, color="0.6", linestyle=":", linewidth=0.8)
            label = f"epoch {int(epoch)}"
            axis.text(
                step,
                0.98,
                f" {label}",
                transform=axis.get_xaxis_transform(),
                fontsize="x-small",
                va="top",
                color="0.4",
            )


@dataclass(frozen=True)
class PlotResult:
    """What :func:`plot_run` wrote: the PNG's path and the axes it drew (group → metrics)."""

    path: str
    groups: dict[str, list[str]]


def plot_run(run: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> PlotResult:
    """Write a PNG of a run's curves (default: ``metrics.png`` next to the metrics) and return what it holds.

    Args:
        run: the run's folder (``drivetrain_logs/version_0``) or its ``metrics.csv``.
        output: where the PNG goes.
    """
    rows = read_run(run)
    source = paths.normalize(run)
    folder = paths.parent(source) if paths.isfile(source) else source
    figure, groups = build_figure(rows, title=str(folder))
    target = paths.normalize(output) if output is not None else paths.join(folder, PLOT_FILE)
    paths.makedirs(paths.parent(target))
    with paths.open_file(target, "wb") as file:
        figure.savefig(file, format="png", dpi=100, metadata={GROUPS_KEY: json.dumps(groups)})
    return PlotResult(str(target), groups)
