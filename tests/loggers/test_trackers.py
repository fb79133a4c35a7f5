"""Accelerate's tracker interface: ``GeneralTracker`` subclasses, the built-in trackers over drivetrain's loggers,
``LOGGER_TYPE_TO_CLASS`` and ``register_tracker_class``, ``get_tracker`` and ``log_kwargs``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import drivetrain as dt
from drivetrain.loggers import CSVLogger, TensorBoardLogger
from drivetrain.tracking import (
    LOGGER_TYPE_TO_CLASS,
    GeneralTracker,
    TensorBoardTracker,
    get_available_trackers,
    register_tracker_class,
)


class MyCustomTracker(GeneralTracker):
    """Accelerate's own test tracker (test_tracking.py), with only its import changed: rows of a CSV file."""

    _col_names = [
        "total_loss",
        "iteration",
        "my_text",
        "learning_rate",
        "num_iterations",
        "some_boolean",
        "some_string",
    ]

    name = "my_custom_tracker"
    requires_logging_directory = False

    def __init__(self, dir: str) -> None:
        self.f = open(f"{dir}/log.csv", "w+")  # noqa: SIM115 - closed by finish(), as in Accelerate's test
        self.writer = csv.DictWriter(self.f, fieldnames=self._col_names)
        self.writer.writeheader()

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.writerow(values)

    def log(self, values: dict[str, Any], step: int | None) -> None:  # type: ignore[override]
        self.writer.writerow(values)

    def finish(self) -> None:
        self.f.close()


def _rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "log.csv") as file:
        return list(csv.DictReader(file))


def test_accelerates_custom_tracker_test_cases(tmp_path: Path) -> None:
    config = {"num_iterations": 12, "learning_rate": 1e-2, "some_boolean": False, "some_string": "some_value"}
    (tmp_path / "init").mkdir()
    accelerator = dt.Accelerator(cpu=True, log_with=MyCustomTracker(str(tmp_path / "init")))
    accelerator.init_trackers("Some name", config)
    accelerator.end_training()
    assert _rows(tmp_path / "init") == [
        {"total_loss": "", "iteration": "", "my_text": "", "learning_rate": "0.01", "num_iterations": "12"}
        | {"some_boolean": "False", "some_string": "some_value"}
    ]

    (tmp_path / "log").mkdir()
    accelerator = dt.Accelerator(cpu=True, log_with=MyCustomTracker(str(tmp_path / "log")))
    accelerator.init_trackers("Some name")
    accelerator.log({"total_loss": 0.1, "iteration": 1, "my_text": "some_value"}, step=0)
    accelerator.end_training()
    assert _rows(tmp_path / "log") == [
        {
            "total_loss": "0.1",
            "iteration": "1",
            "my_text": "some_value",
            "learning_rate": "",
            "num_iterations": "",
        }
        | {"some_boolean": "", "some_string": ""}
    ]


def test_a_tracker_class_without_its_attributes_says_which() -> None:
    class Incomplete(GeneralTracker):
        name = "incomplete"

    with pytest.raises(NotImplementedError, match=r"misses `requires_logging_directory`, `tracker`"):
        Incomplete()
    blank = GeneralTracker(_blank=True)  # what get_tracker gives off the main process
    blank.log({"x": 1})
    blank.finish()


def test_builtin_trackers_are_faces_of_the_loggers(tmp_path: Path) -> None:
    accelerator = dt.Accelerator(cpu=True, log_with=["tensorboard", "csv"], project_dir=tmp_path)
    accelerator.init_trackers("proj", config={"lr": 0.1})
    accelerator.log({"loss": torch.tensor(0.5), "val": {"acc": 0.25}}, step=3)
    tensorboard = accelerator.get_tracker("tensorboard")
    tensorboard.log({"text": "hello"}, step=3)
    assert isinstance(tensorboard, TensorBoardTracker) and isinstance(tensorboard.logger, TensorBoardLogger)
    assert tensorboard.name == "tensorboard" and tensorboard.requires_logging_directory
    assert tensorboard.writer is tensorboard.tracker is accelerator.get_tracker("tensorboard", unwrap=True)
    assert Path(tensorboard.logging_dir).parent == tmp_path / "proj"  # the logger's attributes show through
    csv_tracker = accelerator.get_tracker("csv")
    assert isinstance(csv_tracker.logger, CSVLogger) and csv_tracker.name == "csv"
    with pytest.raises(TypeError, match="numbers and one-element tensors"):
        csv_tracker.log({"text": "hello"})  # the CSV logger records numbers only
    accelerator.end_training()

    events = EventAccumulator(tensorboard.logging_dir)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(3, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("val/acc")] == [(3, 0.25)]
    assert (
        "text/text_summary" in events.Tags()["tensors"]
    )  # strings become TensorBoard text, as in Accelerate
    with open(csv_tracker.metrics_file_path) as file:
        assert list(csv.DictReader(file)) == [{"loss": "0.5", "step": "3", "val/acc": "0.25"}]


def test_a_tracker_constructed_by_the_user_as_in_accelerate(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("run", tmp_path, flush_secs=1)
    accelerator = dt.Accelerator(cpu=True, log_with=[tracker])
    accelerator.init_trackers("ignored for instances")
    accelerator.log({"loss": 1.0}, step=0)
    assert accelerator.trackers == [tracker] and accelerator.get_tracker("tensorboard") is tracker
    assert Path(tracker.logging_dir) == tmp_path / "run" / "version_0"
    accelerator.end_training()


def test_tracker_classes_by_name(tmp_path: Path) -> None:
    assert {"tensorboard", "wandb", "mlflow"} <= set(LOGGER_TYPE_TO_CLASS)
    assert "tensorboard" in get_available_trackers()

    class Recorder(GeneralTracker):
        name = "recorder"
        requires_logging_directory = True
        made: list[Recorder] = []

        def __init__(self, run_name: str, logging_dir: str, flag: int = 0) -> None:
            super().__init__()
            self.args, self.calls = (run_name, logging_dir, flag), []
            Recorder.made.append(self)

        @property
        def tracker(self) -> list[Any]:
            return self.calls

        def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
            self.calls.append((values, step, kwargs))

    register_tracker_class(Recorder)
    try:
        accelerator = dt.Accelerator(cpu=True, log_with="recorder", project_dir=tmp_path)
        accelerator.init_trackers("proj", init_kwargs={"recorder": {"flag": 7}})
        accelerator.log({"a": {"b": 1}}, step=2, log_kwargs={"recorder": {"commit": False}})
        (made,) = Recorder.made
        assert made.args == ("proj", str(tmp_path), 7)
        assert made.calls == [
            ({"a": {"b": 1}}, 2, {"commit": False})
        ]  # a user's tracker gets the values as given
        with pytest.raises(
            ValueError, match=r"log_kwargs names \['wandb'\], which no started tracker is called"
        ):
            accelerator.log({"a": 1}, log_kwargs={"wandb": {}})
        with pytest.raises(ValueError, match="'recorder' tracker requires a logging directory"):
            dt.Accelerator(cpu=True, log_with="recorder").init_trackers("proj")
        with pytest.warns(UserWarning, match="replaces Recorder as the tracker named 'recorder'"):
            register_tracker_class(Recorder)
    finally:
        del LOGGER_TYPE_TO_CLASS["recorder"]
    with pytest.raises(ValueError, match="expects a GeneralTracker subclass"):
        register_tracker_class(CSVLogger)  # type: ignore[arg-type]


def test_the_trainer_refuses_a_tracker_with_advice(tmp_path: Path) -> None:
    tracker = MyCustomTracker(str(tmp_path))
    with pytest.raises(TypeError, match=r"GeneralTracker is Accelerate's tracker interface.*Logger subclass"):
        dt.Trainer(accelerator="cpu", devices=1, logger=tracker, default_root_dir=tmp_path)
    tracker.finish()
