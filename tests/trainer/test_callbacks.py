"""Built-in callbacks: early stopping, learning-rate monitor, throughput, model summary, progress bar."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from drivetrain.loggers import CSVLogger
from drivetrain.trainer import (
    EarlyStopping,
    LearningRateMonitor,
    ModelSummary,
    ThroughputMonitor,
    TQDMProgressBar,
)
from drivetrain.trainer.callbacks import progress
from trainer.trainer_models import Regression, loader, quiet_trainer


def _scored(scores: list[float]) -> Regression:
    values = iter(scores)

    class Scored(Regression):
        def on_validation_epoch_end(self) -> None:
            self.log("score", next(values))

    return Scored()


@pytest.mark.parametrize(
    ("scores", "kwargs", "stopped_after"),
    [
        ([5, 4, 4.5, 4.2, 4.1, 1, 1], {"patience": 3}, 5),  # epochs 2, 3, 4 do not beat 4
        ([5, 4, 3.99, 3.98, 3.97, 1], {"patience": 2, "min_delta": 0.05}, 4),
        ([1, 2, 3, 4, 5, 6], {"patience": 1, "mode": "max", "stopping_threshold": 3.5}, 4),
        ([1, 2, float("nan"), 4, 5, 6], {"patience": 10, "mode": "max"}, 3),
        # divergence_threshold: a score worse than it stops at once, whatever the patience.
        ([3, 4, 4.5, 6, 1, 1], {"patience": 10, "divergence_threshold": 5}, 4),
        ([3, 2, 1.5, 0.5, 9, 9], {"patience": 10, "mode": "max", "divergence_threshold": 1}, 4),
    ],
)
def test_early_stopping(scores: list[float], kwargs: dict[str, Any], stopped_after: int) -> None:
    stopper = EarlyStopping("score", **kwargs)
    trainer = quiet_trainer(max_epochs=len(scores), limit_train_batches=1, callbacks=[stopper])
    trainer.fit(_scored(scores), loader(), loader())
    assert trainer.current_epoch == stopped_after
    assert stopper.stopped_epoch == stopped_after - 1
    assert trainer.should_stop and stopper.stopping_reason


def test_early_stopping_on_a_training_metric_without_validation() -> None:
    class Flat(Regression):
        def on_train_epoch_end(self) -> None:
            self.log("flat", 1.0)

    trainer = quiet_trainer(
        max_epochs=10, limit_train_batches=1, callbacks=[EarlyStopping("flat", patience=2)]
    )
    trainer.fit(Flat(), loader())
    assert trainer.current_epoch == 3  # epoch 0 sets the best; 1 and 2 do not improve


def test_early_stopping_after_mid_epoch_validations() -> None:
    stopper = EarlyStopping("score", patience=1)
    trainer = quiet_trainer(max_epochs=5, val_check_interval=0.25, callbacks=[stopper])
    trainer.fit(_scored([3, 2, 2, 2, 2, 2, 2, 2]), loader(), loader())
    assert trainer.global_step == 6  # validations after steps 2, 4, 6: the third does not improve


def test_early_stopping_without_its_metric_warns_and_goes_on_unless_strict() -> None:
    stopper = EarlyStopping("missing", strict=False)
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=1, callbacks=[stopper])
    with pytest.warns(
        UserWarning, match=r"EarlyStopping\(monitor='missing'\) found no logged metric 'missing' \(logged: "
    ):
        trainer.fit(Regression(), loader(), loader())
    assert trainer.current_epoch == 2 and not trainer.should_stop
    strict = quiet_trainer(max_epochs=2, limit_train_batches=1, callbacks=[EarlyStopping("missing")])
    with pytest.raises(ValueError, match=r"found no logged metric 'missing' \(logged: .*val_loss"):
        strict.fit(Regression(), loader(), loader())


def test_learning_rate_monitor_logs_every_group(tmp_path: Path) -> None:
    class Groups(Regression):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(
                [{"params": self.net[0].parameters(), "lr": 1.0}, {"params": self.net[3].parameters()}],
                lr=0.5,
                momentum=0.9,
            )
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return [optimizer], [{"scheduler": scheduler, "interval": "step"}]

    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    trainer = quiet_trainer(
        max_steps=4, log_every_n_steps=2, logger=logger, callbacks=[LearningRateMonitor(log_momentum=True)]
    )
    trainer.fit(Groups(), loader())
    logger.save()
    with open(logger.metrics_file_path, newline="") as file:
        rows = [r for r in csv.DictReader(file) if r.get("lr-SGD/pg1")]
    # Lightning's moments: before the batch whose optimizer step makes a multiple of log_every_n_steps.
    assert [(r["step"], float(r["lr-SGD/pg1"]), float(r["lr-SGD/pg2"])) for r in rows] == [
        ("1", 0.5, 0.25),
        ("3", 0.125, 0.0625),
    ]
    assert all(float(r["lr-SGD/pg1-momentum"]) == 0.9 for r in rows)


def test_learning_rate_monitor_needs_a_logger() -> None:
    with pytest.raises(
        ValueError, match=r"LearningRateMonitor needs a logger to write to, but the Trainer has none"
    ):
        quiet_trainer(callbacks=[LearningRateMonitor()]).fit(Regression(), loader())


def test_throughput_monitor_reports_rates_and_mfu() -> None:
    class Measured(Regression):
        flops_per_batch = 1_000_000

    monitor = ThroughputMonitor(window_size=4, available_flops=1e9)
    trainer = quiet_trainer(max_steps=8, log_every_n_steps=4, callbacks=[monitor])
    trainer.fit(Measured(), loader())
    rates = monitor.last
    assert rates["train/device/batches_per_sec"] > 0 and (rates["train/batches"], rates["train/samples"]) == (
        8,
        64,
    )
    assert rates["train/device/samples_per_sec"] == pytest.approx(rates["train/device/batches_per_sec"] * 8)
    assert rates["train/device/mfu"] == pytest.approx(rates["train/device/flops_per_sec"] / 1e9)
    assert "train/batches_per_sec" not in rates  # the all-process rates when there are several processes
    assert rates["train/time"] > 0


def test_throughput_monitor_takes_lightnings_length_fn_and_separator() -> None:
    monitor = ThroughputMonitor(
        lambda batch: 2 * len(batch[0]), length_fn=lambda batch: batch[0].numel(), separator="|"
    )
    quiet_trainer(max_steps=4, log_every_n_steps=2, callbacks=[monitor]).fit(Regression(), loader())
    rates = monitor.last
    assert (rates["train|samples"], rates["train|lengths"]) == (
        4 * 16,
        4 * 8 * 4,
    )  # batches of 8 with 4 features
    assert rates["train|device|items_per_sec"] == pytest.approx(rates["train|device|samples_per_sec"] * 2)


def test_model_summary_logs_layers_and_totals(caplog: pytest.LogCaptureFixture) -> None:
    trainer = quiet_trainer(max_steps=1, enable_model_summary=True, callbacks=[ModelSummary(max_depth=2)])
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        trainer.fit(Regression(), loader())
    (out,) = [
        r.getMessage() for r in caplog.records if r.name == "drivetrain.trainer.callbacks.model_summary"
    ]
    assert "net.0  Linear" in out and "net.3  Linear" in out
    assert "49  trainable params" in out and "49  total params" in out


def test_progress_bar_shows_epochs_and_prog_bar_metrics(capfd: pytest.CaptureFixture[str]) -> None:
    trainer = quiet_trainer(
        max_epochs=2, enable_progress_bar=True, callbacks=[TQDMProgressBar(refresh_interval=0)]
    )
    trainer.fit(Regression(), loader(), loader())
    err = capfd.readouterr().err
    assert "Epoch 0: 100%" in err and "Epoch 1: 100%" in err and "8/8" in err
    assert "train_loss=" in err and "val_loss=" in err


def test_progress_bar_is_silent_off_rank_zero(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bar = TQDMProgressBar(refresh_interval=0)
    trainer = quiet_trainer(max_epochs=1, enable_progress_bar=True, callbacks=[bar])
    monkeypatch.setattr(type(trainer.strategy), "is_global_zero", property(lambda self: False))
    trainer.fit(Regression(), loader())
    assert "Epoch" not in capfd.readouterr().err
    assert not bar.is_enabled


def test_progress_bar_takes_lightnings_refresh_rate(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Redraws happen on a terminal (a captured stream gets plain lines): draw as if stderr were one.
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    trainer = quiet_trainer(
        max_epochs=1, enable_progress_bar=True, callbacks=[TQDMProgressBar(refresh_rate=4)]
    )
    trainer.fit(Regression(), loader())
    err = capfd.readouterr().err
    assert "4/8" in err and "8/8" in err  # redrawn every 4 batches, whatever the time
    assert not any(f"{n}/8" in err for n in (1, 2, 3, 5, 6, 7))

    off = TQDMProgressBar(0)  # Lightning's way to turn the bar off
    quiet_trainer(max_epochs=1, enable_progress_bar=True, callbacks=[off]).fit(Regression(), loader())
    assert "Epoch" not in capfd.readouterr().err and not off.is_enabled
    with pytest.raises(ValueError, match="give one"):
        TQDMProgressBar(refresh_rate=2, refresh_interval=0.5)
    with pytest.raises(ValueError, match="number of batches >= 1"):
        TQDMProgressBar(refresh_rate=-1)
