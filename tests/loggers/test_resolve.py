"""One resolver for ``Trainer(logger=...)`` and ``Accelerator(log_with=...)``: the same names mean the same loggers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain._utilities import imports
from drivetrain.loggers import CSVLogger, Logger, LoggerRegistry, MLFlowLogger, TensorBoardLogger, WandbLogger
from drivetrain.loggers.resolve import parse_loggers
from drivetrain.utils import LoggerType
from trainer.trainer_models import Regression, loader, quiet_trainer

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _events(log_dir: str) -> Any:
    accumulator = event_accumulator.EventAccumulator(log_dir)
    accumulator.Reload()
    return accumulator


def _accelerator_run(root: Path, log_with: Any, hparams: dict[str, Any]) -> dt.Accelerator:
    """The Trainer's loop by hand: same seed, data, optimizer; ``train_loss`` logged at every step."""
    torch.manual_seed(0)
    model = Regression(**hparams)
    accelerator = dt.Accelerator(cpu=True, log_with=log_with, project_dir=root)
    accelerator.init_trackers("drivetrain_logs", config=dict(model.hparams))
    optimizer = model.configure_optimizers()
    net, optimizer, data = accelerator.prepare(model, optimizer, loader())
    for step, (x, y) in enumerate(data):  # Lightning's x-axis: the optimizer steps before this one
        loss = nn.functional.mse_loss(net(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"train_loss": loss, "epoch": 0}, step=step)
    accelerator.end_training()
    return accelerator


def test_tensorboard_by_name_writes_the_same_events_from_both_doors(tmp_path: Path) -> None:
    hparams = {"lr": 0.05, "features": 4}
    torch.manual_seed(0)
    trainer = quiet_trainer(
        logger="tensorboard", default_root_dir=tmp_path / "trainer", max_epochs=1, log_every_n_steps=1
    )
    trainer.fit(Regression(**hparams), loader())
    accelerator = _accelerator_run(tmp_path / "accelerator", "tensorboard", hparams)

    (from_trainer,) = trainer.loggers
    from_accelerator = accelerator.get_tracker("tensorboard").logger  # the logger behind Accelerate's tracker
    assert type(from_trainer) is type(from_accelerator) is TensorBoardLogger
    assert Path(from_trainer.log_dir) == tmp_path / "trainer" / "drivetrain_logs" / "version_0"
    assert Path(from_accelerator.log_dir) == tmp_path / "accelerator" / "drivetrain_logs" / "version_0"
    trainer_events, accelerator_events = _events(from_trainer.log_dir), _events(from_accelerator.log_dir)
    trainer_loss = [(e.step, e.value) for e in trainer_events.Scalars("train_loss")]
    accelerator_loss = [(e.step, e.value) for e in accelerator_events.Scalars("train_loss")]
    assert [step for step, _ in trainer_loss] == [step for step, _ in accelerator_loss] == list(range(8))
    # The same seed, data and optimizer: the same losses, whichever door ran the loop.
    assert [value for _, value in trainer_loss] == pytest.approx([value for _, value in accelerator_loss])
    assert {e.value for e in trainer_events.Scalars("epoch")} == {0.0}
    for events in (trainer_events, accelerator_events):
        start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        assert b"lr" in start and b"features" in start
    assert (
        Path(from_trainer.log_dir, "hparams.yaml").read_text()
        == Path(from_accelerator.log_dir, "hparams.yaml").read_text()
    )


def test_the_default_logger_is_tensorboard_when_installed_else_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (default,) = dt.Trainer(accelerator="cpu", devices=1, default_root_dir=tmp_path).loggers
    assert isinstance(default, TensorBoardLogger)
    assert Path(default.root_dir) == tmp_path / "drivetrain_logs"
    accelerator = dt.Accelerator(cpu=True, log_with=True, project_dir=tmp_path)
    accelerator.init_trackers("default")
    assert [tracker.name for tracker in accelerator.trackers] == ["tensorboard"]
    accelerator.end_training()

    monkeypatch.setattr(imports, "package_available", lambda name: name != "tensorboard")
    (fallback,) = dt.Trainer(accelerator="cpu", devices=1, default_root_dir=tmp_path).loggers
    assert isinstance(fallback, CSVLogger) and Path(fallback.root_dir) == tmp_path / "drivetrain_logs"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("csv", [CSVLogger]),
        ("CSV", [CSVLogger]),
        (LoggerType.TENSORBOARD, [TensorBoardLogger]),
        (["csv", "tensorboard", "csv"], [CSVLogger, TensorBoardLogger]),
        ("wandb", [WandbLogger]),
        ("mlflow", [MLFlowLogger]),
        ("all", [CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger]),
        (True, [TensorBoardLogger]),
        (False, []),
    ],
)
def test_every_accepted_value_means_the_same_loggers_in_both_doors(
    tmp_path: Path, value: Any, expected: list[type]
) -> None:
    trainer = dt.Trainer(accelerator="cpu", devices=1, logger=value, default_root_dir=tmp_path)
    accelerator = dt.Accelerator(cpu=True, log_with=value, project_dir=tmp_path)
    accelerator.init_trackers("drivetrain_logs")
    assert [type(logger) for logger in trainer.loggers] == expected
    assert [type(tracker.logger) for tracker in accelerator.trackers] == expected
    for built in (trainer.loggers, [tracker.logger for tracker in accelerator.trackers]):
        for logger in built:
            assert logger.name in ("drivetrain_logs", None) or isinstance(logger, MLFlowLogger)
            assert logger.save_dir is not None and str(tmp_path) in logger.save_dir


def test_none_means_each_peers_default(tmp_path: Path) -> None:
    # Lightning's Trainer(logger=None) is its default logger (None only marks "not given", so that
    # barebones=True can tell); Accelerate's log_with=None is no tracker at all.
    trainer = dt.Trainer(accelerator="cpu", devices=1, logger=None, default_root_dir=tmp_path)
    assert [type(logger) for logger in trainer.loggers] == [TensorBoardLogger]
    assert dt.Accelerator(cpu=True, log_with=None, project_dir=tmp_path).trackers == []


def test_instances_and_names_mix_and_keep_their_order(tmp_path: Path) -> None:
    mine = CSVLogger(tmp_path, name="mine")
    trainer = dt.Trainer(
        accelerator="cpu", devices=1, logger=[mine, "tensorboard"], default_root_dir=tmp_path
    )
    assert trainer.loggers[0] is mine and isinstance(trainer.loggers[1], TensorBoardLogger)
    accelerator = dt.Accelerator(cpu=True, log_with=["tensorboard", mine], project_dir=tmp_path)
    accelerator.init_trackers("run", init_kwargs={"tensorboard": {"flush_secs": 5}})
    assert accelerator.trackers[1].logger is mine and accelerator.get_tracker("csv").logger is mine
    assert accelerator.get_tracker("TensorBoardLogger") is accelerator.trackers[0]
    assert accelerator.get_tracker("tensorboard", unwrap=True) is accelerator.trackers[0].experiment


def test_bad_values_are_explained_the_same_way_by_both_doors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for door in (
        lambda v: dt.Trainer(accelerator="cpu", devices=1, logger=v, default_root_dir=tmp_path),
        lambda v: dt.Accelerator(cpu=True, log_with=v),
    ):
        with pytest.raises(ValueError, match=r"names the logger 'comet', which is unknown.*'csv', 'mlflow'"):
            door("comet")
        with pytest.raises(TypeError, match=r"holds int \(3\).*'all' \(every installed one\)"):
            door(["csv", 3])
    with pytest.raises(ValueError, match=r"names the logger 'comet'"):
        dt.Trainer(accelerator="cpu", devices=1, logger="comet", fast_dev_run=True)  # checked, then dropped
    monkeypatch.setattr(imports, "package_available", lambda name: name != "wandb")
    with pytest.raises(
        ImportError, match=r"WandbLogger needs the 'wandb' package.*pip install 'drivetrain\[wandb\]'"
    ):
        dt.Trainer(accelerator="cpu", devices=1, logger="wandb")
    with pytest.raises(ImportError, match=r"pip install 'drivetrain\[wandb\]'"):
        dt.Accelerator(cpu=True, log_with=["csv", "wandb"])
    assert WandbLogger not in [type(t) for t in _built("all", tmp_path)]  # 'all': the installed ones


def _built(value: Any, root: Path) -> list[Logger]:
    accelerator = dt.Accelerator(cpu=True, log_with=value, project_dir=root)
    accelerator.init_trackers("run")
    return [tracker.logger for tracker in accelerator.trackers]


class Recorder(Logger):
    """A user's logger: registered by name, it works wherever a built-in name does."""

    def __init__(self, save_dir: str | None = None, name: str = "", flush: bool = False) -> None:
        self.save_dir_given, self.experiment_name, self.flush = save_dir, name, flush
        self.rows: list[tuple[int | None, dict[str, float]]] = []
        self.params: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self.experiment_name

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any) -> None:
        self.params.update(params)


def test_a_registered_logger_works_by_name_in_both_doors(tmp_path: Path) -> None:
    LoggerRegistry.register("recorder", Recorder, description="rows in memory", flush=True)
    trainer = quiet_trainer(logger="recorder", default_root_dir=tmp_path, max_steps=2, log_every_n_steps=1)
    trainer.fit(Regression(lr=0.25), loader())
    (recorder,) = trainer.loggers
    assert isinstance(recorder, Recorder) and recorder.flush
    assert (recorder.save_dir_given, recorder.experiment_name) == (str(tmp_path), "drivetrain_logs")
    assert [step for step, _ in recorder.rows] == [0, 1] and recorder.params["lr"] == 0.25
    assert "recorder" in parse_loggers("all")
    (tracker,) = _built("recorder", tmp_path)
    assert isinstance(tracker, Recorder) and tracker.experiment_name == "run"


def test_file_loggers_need_a_folder_and_options_need_a_named_logger(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"'tensorboard' logger writes files and needs a directory: pass Accelerator\(project_dir",
    ):
        dt.Accelerator(cpu=True, log_with="tensorboard").init_trackers("run")
    accelerator = dt.Accelerator(cpu=True, log_with="csv", project_dir=tmp_path)
    with pytest.raises(
        ValueError, match=r"Options were given for 'tensorboard', which the logger setting does not name"
    ):
        accelerator.init_trackers("run", init_kwargs={"tensorboard": {}})
