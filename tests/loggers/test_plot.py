"""``drivetrain plot RUN_DIR`` and ``CSVLogger.plot``: a PNG with one axis per metric group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from drivetrain._utilities import imports
from drivetrain.cli.main import main
from drivetrain.loggers import CSVLogger, TensorBoardLogger
from drivetrain.loggers.plot import GROUPS_KEY, build_figure, metric_group, read_run
from trainer.trainer_models import Regression, loader, quiet_trainer

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")


class Logged(Regression):
    """train_loss per step, val_loss per epoch, an accuracy both ways and for validation, a learning rate."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_acc", 1.0 / (1.0 + loss.detach()), on_step=True, on_epoch=True)
        self.log("lr", 0.05)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        self.log("val_acc", 0.5)


EXPECTED_GROUPS = {
    "loss": ["train_loss", "val_loss"],
    "acc": ["train_acc_epoch", "train_acc_step", "val_acc"],
    "lr": ["lr"],
}


def _fit(logger: Any) -> None:
    quiet_trainer(logger=logger, max_epochs=3, log_every_n_steps=2).fit(Logged(), loader(), loader())


def _png_groups(path: Path) -> dict[str, list[str]]:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 600 and image.size[1] > 300
        return json.loads(image.text[GROUPS_KEY])


def test_the_command_draws_one_axis_per_metric_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = CSVLogger(tmp_path)
    _fit(logger)
    assert main(["plot", logger.log_dir]) == 0
    png = Path(logger.log_dir, "metrics.png")
    assert f"wrote {png} with 3 axes: loss (2), acc (3), lr (1)" in capsys.readouterr().out
    assert _png_groups(png) == EXPECTED_GROUPS

    figure, groups = build_figure(read_run(logger.metrics_file_path))
    titles = [axis.get_title() for axis in figure.axes]
    assert titles == ["loss", "acc", "lr"] and groups == EXPECTED_GROUPS
    loss_axis = figure.axes[0]
    assert [line.get_label() for line in loss_axis.get_lines() if not line.get_label().startswith("_")] == [
        "train_loss",
        "val_loss",
    ]
    epoch_marks = [text.get_text().strip() for text in loss_axis.texts]
    assert epoch_marks == ["epoch 0", "epoch 1", "epoch 2"]


def test_csv_logger_plot_and_tensorboard_runs(tmp_path: Path) -> None:
    csv_logger = CSVLogger(tmp_path, name="csv", flush_logs_every_n_steps=1000)
    _fit(csv_logger)
    written = csv_logger.plot(tmp_path / "out" / "curves.png")  # flushes what is buffered first
    assert written == str(tmp_path / "out" / "curves.png") and _png_groups(Path(written)) == EXPECTED_GROUPS

    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    _fit(tensorboard)
    assert main(["plot", tensorboard.log_dir, "-o", str(tmp_path / "tb.png")]) == 0
    assert _png_groups(tmp_path / "tb.png") == EXPECTED_GROUPS


def test_groups_follow_lightning_names() -> None:
    names = ["train_loss_step", "train_loss_epoch", "only_step", "val/acc", "test_loss/dataloader_idx_1"]
    assert [metric_group(n, names) for n in names] == ["loss", "loss", "only_step", "acc", "loss"]


def test_missing_metrics_or_matplotlib_are_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plot", str(tmp_path)]) == 1
    assert "No logged metrics in" in capsys.readouterr().err
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    monkeypatch.setattr(imports, "package_available", lambda name: name != "matplotlib")
    assert main(["plot", logger.log_dir]) == 1
    assert "pip install 'drivetrain[plot]'" in capsys.readouterr().err
