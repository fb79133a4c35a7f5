"""CSVLogger: versioned folders, a widening metrics table, hyperparameters, rank-zero writes."""

from __future__ import annotations

import csv
from argparse import Namespace
from pathlib import Path

import pytest
import torch
import yaml

from drivetrain.loggers import CSVLogger


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_versions_count_up_and_folders_follow_the_layout(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path, name="exp")
    first.log_metrics({"loss": 1.0}, step=0)
    first.save()
    second = CSVLogger(tmp_path, name="exp")
    assert (first.version, second.version) == (0, 1)
    assert first.log_dir == str(tmp_path / "exp" / "version_0")
    assert CSVLogger(tmp_path, name="exp", version="custom").log_dir == str(tmp_path / "exp" / "custom")
    assert CSVLogger(tmp_path, name=None, version=3).log_dir == str(tmp_path / "version_3")
    assert CSVLogger(tmp_path).name == "drivetrain_logs"


def test_new_metrics_widen_the_table_and_earlier_rows_are_kept(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    logger.log_metrics({"loss": torch.tensor(0.5)}, step=1)
    logger.log_metrics({"loss": 0.25, "acc": 0.75}, step=2)
    logger.log_metrics({"acc": 1}, step=3)
    logger.finalize("success")
    rows = _rows(logger.metrics_file_path)
    assert list(rows[0]) == ["step", "acc", "loss"]
    assert [(r["step"], r["loss"], r["acc"]) for r in rows] == [
        ("1", "0.5", ""),
        ("2", "0.25", "0.75"),
        ("3", "", "1"),  # an int stays an int (an epoch reads 3, not 3.0)
    ]


def test_rows_are_buffered_until_the_flush_interval(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=3)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.log_metrics({"a": 2.0}, step=1)
    assert not Path(logger.metrics_file_path).exists()
    logger.log_metrics({"a": 3.0}, step=2)
    assert [r["a"] for r in _rows(logger.metrics_file_path)] == ["1.0", "2.0", "3.0"]


def test_hyperparameters_are_merged_into_yaml(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_hyperparams({"lr": 0.1, "layers": [4, 8], "nested": {"a": 1}})
    logger.log_hyperparams(Namespace(batch_size=32, device=torch.device("cpu")))
    saved = yaml.safe_load(Path(logger.log_dir, "hparams.yaml").read_text())
    assert saved == {"lr": 0.1, "layers": [4, 8], "nested": {"a": 1}, "batch_size": 32, "device": "cpu"}


def test_the_experiment_is_lightnings_experiment_writer(tmp_path: Path) -> None:
    # Lightning's tests and callbacks write through logger.experiment and read its buffer and file path.
    logger = CSVLogger(tmp_path)
    experiment = logger.experiment
    experiment.log_metrics({"loss": torch.tensor(0.5)}, step=3)
    experiment.log_metrics({"acc": 1.0})
    assert experiment.metrics == [{"loss": 0.5, "step": 3}, {"acc": 1.0, "step": 1}]
    assert not Path(experiment.metrics_file_path).exists()
    experiment.save()
    assert experiment.metrics == [] and experiment.metrics_keys == ["step", "acc", "loss"]
    assert experiment.metrics_file_path == logger.metrics_file_path and experiment.log_dir == logger.log_dir
    assert [(r["step"], r["loss"], r["acc"]) for r in _rows(experiment.metrics_file_path)] == [
        ("3", "0.5", ""),
        ("1", "", "1.0"),
    ]
    experiment.log_hparams({"lr": 0.1})
    assert experiment.hparams == {"lr": 0.1}
    assert yaml.safe_load(Path(logger.log_dir, "hparams.yaml").read_text()) == {"lr": 0.1}


def test_only_rank_zero_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.log_hyperparams({"lr": 0.1})
    logger.finalize("success")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("metrics", "error", "match"),
    [
        (
            {"x": torch.ones(2)},
            ValueError,
            r"The metric 'x' is a tensor of shape \(2,\); loggers record scalars",
        ),
        ({"x": "high"}, TypeError, r"The metric 'x' has the value 'high' of type str"),
    ],
)
def test_non_scalar_metrics_are_rejected(tmp_path: Path, metrics: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CSVLogger(tmp_path).log_metrics(metrics, step=0)


def test_bad_arguments_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"flush_logs_every_n_steps=0; use 1 or more"):
        CSVLogger(tmp_path, flush_logs_every_n_steps=0)
    with pytest.raises(
        TypeError, match=r"version= expects None \(the next free version\), an int or a folder"
    ):
        CSVLogger(tmp_path, version=1.5)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"log_hyperparams expects a dict, an argparse.Namespace or a dataclass"
    ):
        CSVLogger(tmp_path).log_hyperparams([1, 2])  # type: ignore[arg-type]
