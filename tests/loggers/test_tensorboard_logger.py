"""TensorBoardLogger: real event files that TensorBoard's own reader understands."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import yaml

from drivetrain._utilities import imports
from drivetrain.loggers import TensorBoardLogger

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _read(log_dir: str) -> object:
    accumulator = event_accumulator.EventAccumulator(log_dir)
    accumulator.Reload()
    return accumulator


def test_scalars_are_readable_by_tensorboard(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="exp")
    logger.log_metrics({"loss": torch.tensor(0.5), "acc": 0.25}, step=3)
    logger.log_metrics({"loss": 0.125}, step=7)
    logger.finalize("success")
    events = _read(logger.log_dir)
    assert logger.log_dir == str(tmp_path / "exp" / "version_0")
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(3, 0.5), (7, 0.125)]
    assert [(e.step, e.value) for e in events.Scalars("acc")] == [(3, 0.25)]


def test_hyperparameters_reach_the_hparams_dashboard_and_yaml(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path)
    logger.log_hyperparams({"lr": 0.01, "model": {"width": 8}, "act": torch.nn.ReLU()})
    logger.finalize("success")
    content = _read(logger.log_dir).PluginTagToContent("hparams")
    experiment = content["_hparams_/session_start_info"]
    assert b"lr" in experiment and b"model/width" in experiment and b"ReLU()" in experiment
    assert yaml.safe_load(Path(logger.log_dir, "hparams.yaml").read_text()) == {
        "lr": 0.01,
        "model": {"width": 8},
        "act": "ReLU()",
    }


def test_the_writer_is_not_pickled_and_reopens(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, version=0)
    logger.log_metrics({"a": 1.0}, step=0)
    copy = pickle.loads(pickle.dumps(logger))
    copy.log_metrics({"a": 2.0}, step=1)
    copy.finalize("success")
    logger.finalize("success")
    accumulator = event_accumulator.EventAccumulator(str(tmp_path / "drivetrain_logs" / "version_0"))
    accumulator.Reload()
    assert sorted(e.step for e in accumulator.Scalars("a")) == [0, 1]


def test_a_missing_tensorboard_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "package_available", lambda name: name != "tensorboard")
    with pytest.raises(ImportError, match=r"pip install 'drivetrain\[tensorboard\]'"):
        TensorBoardLogger(tmp_path)
