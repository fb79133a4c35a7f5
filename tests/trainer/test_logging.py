"""self.log: defaults per hook, epoch reductions, logger cadence, and no device sync on the step path."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch

from drivetrain.loggers import CSVLogger
from drivetrain.trainer.results import ResultCollection
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


def _log(results: ResultCollection, name: str, value: Any, **options: Any) -> None:
    settings = {
        "prog_bar": False,
        "logger": True,
        "on_step": None,
        "on_epoch": None,
        "reduce_fx": "mean",
        "sync_dist": None,
        "batch_size": None,
    }
    settings.update(options)
    results.log(name, value, *settings.values())


def test_epoch_mean_is_weighted_by_batch_size_and_other_reductions() -> None:
    results = ResultCollection(training=False)
    results.batch_level = True
    for values, batch in (
        ([1.0, 10.0, 5.0, 7.0], torch.zeros(4, 2)),
        ([4.0, 20.0, 1.0, 3.0], torch.zeros(2, 2)),
    ):
        results.mark += 1
        results.batch = (batch, batch)
        _log(results, "mean", torch.tensor(values[0]))
        _log(results, "sum", values[1], reduce_fx="sum")
        _log(results, "max", torch.tensor(values[2]), reduce_fx=torch.max)
        _log(results, "min", values[3], reduce_fx="min")
    epoch = results.reduce_epoch()
    assert epoch["mean"].item() == pytest.approx((1.0 * 4 + 4.0 * 2) / 6)
    assert (epoch["sum"].item(), epoch["max"].item(), epoch["min"].item()) == (30.0, 5.0, 3.0)


def test_training_defaults_and_names_for_step_and_epoch() -> None:
    results = ResultCollection(training=True)
    results.batch_level = True
    results.mark = 1
    _log(results, "loss", torch.tensor(2.0))
    _log(results, "both", torch.tensor(3.0), on_epoch=True, batch_size=1)
    assert results.step_metrics() == {"loss": torch.tensor(2.0), "both_step": torch.tensor(3.0)}
    results.batch_level = False
    results.reduce_epoch()
    assert set(results.epoch_values) == {"both", "both_epoch"}
    _log(results, "at_epoch_end", 5.0)
    assert results.epoch_values["at_epoch_end"].item() == 5.0


def test_conflicting_settings_and_bad_values_are_explained() -> None:
    results = ResultCollection(training=True)
    results.batch_level = True
    _log(results, "loss", 1.0, batch_size=1)
    with pytest.raises(
        ValueError, match=r"'loss' is logged in two places with different settings .*on_epoch=False"
    ):
        _log(results, "loss", 1.0, on_epoch=True, batch_size=1)
    with pytest.raises(
        TypeError, match=r"self.log\('bad', value\) got str \('x'\); log a number or a one-element"
    ):
        _log(results, "bad", "x")
    with pytest.raises(ValueError, match=r"reduce_fx='median'\): use one of mean, sum, max, min"):
        _log(results, "m", 1.0, reduce_fx="median")
    with pytest.raises(ValueError, match=r"on_step=False, on_epoch=False\) would record nothing"):
        _log(results, "n", 1.0, on_step=False, on_epoch=False)
    results.batch_level = False
    with pytest.raises(ValueError, match=r"on_step=True\) was called outside a batch loop"):
        _log(results, "s", 1.0, on_step=True)


def test_logger_receives_steps_every_n_and_epoch_values(tmp_path: Path) -> None:
    class Logs(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.log("mean_loss", loss, on_step=True, on_epoch=True)
            return loss

    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=3)
    trainer.fit(Logs(), loader(), loader())
    with open(logger.metrics_file_path, newline="") as file:
        rows = list(csv.DictReader(file))
    step_rows = [r for r in rows if r["train_loss"]]
    # Lightning's x-axis: the optimizer steps before the batch (the 3rd step's row is at 2).
    assert [int(r["step"]) for r in step_rows] == [2, 5, 8, 11, 14]
    assert all(r["mean_loss_step"] for r in step_rows)
    epoch_rows = [r for r in rows if r["mean_loss_epoch"]]
    assert [int(r["step"]) for r in epoch_rows] == [7, 15]
    assert [int(r["step"]) for r in rows if r["val_loss"]] == [7, 15]
    metrics = trainer.callback_metrics
    assert {"train_loss", "mean_loss", "mean_loss_step", "mean_loss_epoch", "val_loss"} <= set(metrics)
    assert torch.equal(metrics["mean_loss"], metrics["mean_loss_epoch"])
    assert set(trainer.progress_bar_metrics) == {"train_loss", "val_loss"}
    assert trainer.logged_metrics["epoch"] == 1.0


def test_hyperparameters_reach_the_logger(tmp_path: Path) -> None:
    import yaml

    logger = CSVLogger(tmp_path)
    quiet_trainer(max_steps=1, logger=logger).fit(Regression(lr=0.25), loader())
    assert yaml.safe_load(Path(logger.log_dir, "hparams.yaml").read_text()) == {
        "features": 4,
        "lr": 0.25,
        "dropout": 0.0,
        "optimizer": "sgd",
    }


def test_no_item_calls_on_the_step_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Values stay on the device until needed: no .item() per step when nothing reads them."""
    counted: list[int] = []
    original = torch.Tensor.item

    class Counting(Regression):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0:  # after the DataLoader drew its own seed (one .item() of its own)
                monkeypatch.setattr(torch.Tensor, "item", lambda t: counted.append(1) or original(t))

        def on_train_epoch_end(self) -> None:
            monkeypatch.setattr(torch.Tensor, "item", original)

    trainer = quiet_trainer(max_epochs=1, log_every_n_steps=1000, logger=True, default_root_dir=tmp_path)
    trainer.fit(Counting(), loader(regression_data(256)))
    assert trainer.global_step == 32 and counted == []


def test_log_outside_a_run_warns_once() -> None:
    model = Regression()
    with pytest.warns(UserWarning, match=r"Regression.log\(\) was called outside a Trainer run"):
        model.training_step(next(iter(loader())), 0)
    model.training_step(next(iter(loader())), 0)  # no second warning (pytest would fail on it)


def test_validate_and_test_return_epoch_values_per_loader() -> None:
    trainer = quiet_trainer()
    with pytest.raises(
        TypeError, match=r"give it a third parameter: def validation_step\(self, batch, batch_idx, "
    ):
        trainer.validate(Regression(), [loader(), loader()], verbose=False)
    model = Regression()
    results = trainer.test(model, [loader(), loader(regression_data(24))], verbose=False)
    assert [r["test_count/dataloader_idx_0"] for r in results[:1]] == [64.0]
    assert results[1]["test_count/dataloader_idx_1"] == 24.0
    assert "test_count/dataloader_idx_1" not in results[0]


class _LightningStyle(Regression):
    """Logs a value per step and per epoch, one per step only, one per epoch only (Lightning's cases)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("both", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("epoch_only", loss, on_step=False, on_epoch=True, prog_bar=True)
        return loss


def test_metrics_csv_rows_carry_the_epoch_and_suffixes_only_when_both_are_logged(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=4)
    model = _LightningStyle()
    trainer.fit(model, loader(), loader())
    shown = set(trainer.progress_bar_metrics)
    trainer.test(model, loader(), verbose=False)
    with open(logger.metrics_file_path, newline="") as file:
        rows = list(csv.DictReader(file))

    # epoch on every row, as an integer: step rows, validation rows, epoch-end rows and the test row.
    assert [row["epoch"] for row in rows] == ["0", "0", "0", "0", "1", "1", "1", "1", "2"]
    kinds = [sorted(k for k, v in row.items() if v and k not in ("step", "epoch")) for row in rows]
    step_row, val_row, epoch_row = ["both_step", "train_loss"], ["val_loss"], ["both_epoch", "epoch_only"]
    assert kinds == [step_row, step_row, val_row, epoch_row] * 2 + [["test_count", "test_loss"]]
    assert "both" not in rows[0]  # neither the plain name nor an empty column for it
    # The bar shows each value under one name: both_step during the epoch, both_epoch after it.
    assert shown == {"train_loss", "both_step", "both_epoch", "epoch_only", "val_loss"}
    # Callbacks see every name, the plain one being the latest value.
    assert {"both", "both_step", "both_epoch", "epoch_only"} <= set(trainer.callback_metrics)


def test_a_name_logged_in_training_step_and_again_in_on_train_epoch_end_keeps_both(tmp_path: Path) -> None:
    """As in Lightning 2.6 (recorded from it): the step rows carry training_step's values, the epoch row
    on_train_epoch_end's, and callbacks see the epoch-end value under the plain name."""

    class Twice(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("x", float(batch_idx))
            self.log("y", float(batch_idx), on_epoch=True)
            return super().training_step(batch, batch_idx)

        def on_train_epoch_end(self) -> None:
            self.log("x", 100.0)
            self.log("y", 200.0)

    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=4, logger=logger, log_every_n_steps=1)
    trainer.fit(Twice(), loader())
    metrics = {
        k: float(v) for k, v in trainer.callback_metrics.items() if k in ("x", "y", "y_epoch", "y_step")
    }
    assert metrics == {"x": 100.0, "y": 200.0, "y_epoch": 1.5, "y_step": 3.0}
    with open(logger.metrics_file_path, newline="") as file:
        rows = [
            {k: v for k, v in row.items() if k in ("step", "x", "y", "y_epoch", "y_step") and v}
            for row in csv.DictReader(file)
        ]
    expected: list[dict[str, str]] = []
    for first in (0, 4):
        expected += [{"step": str(first + i), "x": f"{i}.0", "y_step": f"{i}.0"} for i in range(4)]
        expected.append({"step": str(first + 3), "x": "100.0", "y": "200.0", "y_epoch": "1.5"})
    assert rows == expected
