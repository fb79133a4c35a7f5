"""The Trainer's public, read-only state: what built-in callbacks use is what a user's callback can use."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import drivetrain as dt
from drivetrain.loggers import CSVLogger
from drivetrain.trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


class TwoLoaders(Regression):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        super().validation_step(batch, batch_idx)


_OWN = {
    str(Path(dt.__file__).parent / "trainer" / "trainer.py"),
    str(Path(dt.__file__).parent / "trainer" / "properties.py"),
}


class _Watched(dt.Trainer):
    """A Trainer that records every read of a private attribute from code outside the Trainer class's own files."""

    reaches: set[str]

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") and not name.startswith("__"):
            caller = sys._getframe(1)
            where = caller.f_code.co_filename
            if where not in _OWN and where.startswith(str(Path(dt.__file__).parent)):
                object.__getattribute__(self, "reaches").add(
                    f"{Path(where).name}:{caller.f_lineno} trainer.{name}"
                )
        return super().__getattribute__(name)


def test_nothing_outside_the_trainer_reads_its_private_attributes(tmp_path: Path) -> None:
    """The loops, checkpointing, the tuner and every built-in callback get what they need from the run state or the
    public properties: checked on a live Trainer through fit (with validation, checkpoints, early stopping, an LR
    search and logging), resume, validate, test and predict, whatever the variable holding the Trainer is called."""
    from drivetrain.trainer.callbacks import (
        LearningRateFinder,
        LearningRateMonitor,
        ModelSummary,
        Timer,
        TQDMProgressBar,
    )

    def trainer(**kwargs: Any) -> _Watched:
        made = _Watched(
            accelerator="cpu",
            devices=1,
            default_root_dir=tmp_path,
            logger=CSVLogger(tmp_path),
            log_every_n_steps=1,
            num_sanity_val_steps=1,
            **kwargs,
        )
        made.reaches = set()
        return made

    data, val = loader(regression_data(32), batch_size=2), loader(regression_data(16, seed=1))
    callbacks = [
        ModelCheckpoint(dirpath=tmp_path / "checkpoints", monitor="val_loss", save_last=True),
        EarlyStopping(monitor="val_loss", patience=5),
        LearningRateMonitor(),
        Timer(),
        ModelSummary(),
        TQDMProgressBar(),
        LearningRateFinder(min_lr=1e-4, max_lr=1e-2, num_training_steps=16),
    ]
    first = trainer(max_epochs=2, callbacks=callbacks)
    torch.manual_seed(0)
    module = Regression()
    first.fit(module, data, val)
    resumed = trainer(
        max_epochs=3, callbacks=[ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)]
    )
    resumed.fit(module, data, val, ckpt_path="last")
    resumed.validate(module, val, verbose=False)
    resumed.test(module, loader(regression_data(8)), verbose=False)
    resumed.predict(module, loader(regression_data(8)))
    assert first.global_step > 0 and resumed.current_epoch == 3
    assert sorted(first.reaches | resumed.reaches) == []


def test_the_reach_detector_sees_a_private_read() -> None:
    """The detector above is live: a read of ``trainer._run`` from drivetrain's code outside the Trainer is caught
    (the loops reach the run state through the public ``trainer.run_state``)."""
    from drivetrain.trainer import run_state as module

    watched = _Watched(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    watched.reaches = set()
    code = compile("def reach(trainer):\n    return trainer._run\n", module.__file__, "exec")
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    namespace["reach"](watched)
    assert watched.reaches == {"run_state.py:2 trainer._run"}


class Recorder(Callback):
    """A user's callback that reads only the documented state."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int, int, bool, int, int]] = []
        self.validations: list[tuple[int, int, bool, int]] = []
        self.epoch_ends: list[tuple[int, bool, int]] = []
        self.sizes: dict[str, Any] = {}

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        progress = trainer.fit_progress
        assert progress.is_last_batch == trainer.is_last_batch
        self.batches.append(
            (
                progress.epoch,
                batch_idx,
                progress.batches_done,
                trainer.is_last_batch,
                progress.total_batches_done,
                progress.global_step,
            )
        )

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            self.sizes["sanity"] = trainer.num_sanity_val_batches
            return
        progress = trainer.fit_progress
        self.validations.append(
            (progress.epoch, progress.batches_done, progress.epoch_ending, progress.validations_run)
        )

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        progress = trainer.fit_progress
        self.epoch_ends.append((progress.epoch, progress.epoch_ending, progress.validations_run))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.sizes["train"] = trainer.num_training_batches
        self.sizes["val"] = trainer.num_val_batches

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self.sizes["test"] = trainer.num_test_batches

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self.sizes["predict"] = trainer.num_predict_batches


def test_a_callback_reads_progress_batch_counts_and_epoch_ends() -> None:
    recorder = Recorder()
    trainer = quiet_trainer(
        max_epochs=2,
        callbacks=[recorder],
        val_check_interval=0.5,
        num_sanity_val_steps=1,
        accumulate_grad_batches=2,
        limit_val_batches=3,
    )
    model = TwoLoaders()
    trainer.fit(model, loader(batch_size=16), [loader(batch_size=8), loader(batch_size=32)])

    # 4 batches per epoch, validation after batch 2 (mid-epoch) and 4 (closing the epoch).
    assert recorder.sizes == {"sanity": [1, 1], "train": 4, "val": [3, 2]}
    # Whole counts are ints, as in Lightning (callbacks write range(trainer.num_training_batches)).
    assert all(
        type(n) is int for n in [recorder.sizes["train"], *recorder.sizes["sanity"], *recorder.sizes["val"]]
    )
    assert [b[:4] for b in recorder.batches] == [
        (epoch, idx, idx + 1, idx == 3) for epoch in (0, 1) for idx in range(4)
    ]
    assert [b[4] for b in recorder.batches] == list(range(1, 9))
    assert [b[5] for b in recorder.batches] == [0, 1, 1, 2, 2, 3, 3, 4]
    assert recorder.validations == [(0, 2, False, 1), (0, 4, True, 2), (1, 2, False, 3), (1, 4, True, 4)]
    assert recorder.epoch_ends == [(0, True, 2), (1, True, 4)]
    assert trainer.fit_progress.epoch == trainer.current_epoch == 2
    assert trainer.fit_progress.global_step == trainer.global_step == 4
    assert not trainer.is_last_batch
    assert "FitProgressView(epoch=2" in repr(trainer.fit_progress)
    with pytest.raises(AttributeError):
        trainer.fit_progress.epoch = 0  # type: ignore[misc]

    trainer.test(model, loader(batch_size=16), verbose=False)
    assert recorder.sizes["test"] == [4]
    assert isinstance(trainer.test_dataloaders, DataLoader)
    trainer.predict(model, [loader(batch_size=32), loader(batch_size=64)])
    assert recorder.sizes["predict"] == [2, 1]
    assert len(trainer.predict_dataloaders) == 2


class _Stream(IterableDataset):
    def __iter__(self) -> Any:
        data = regression_data(24)
        for index in range(0, 24, 8):
            yield data[index : index + 8]


def test_is_last_batch_is_known_for_a_loader_without_length() -> None:
    recorder = Recorder()
    trainer = quiet_trainer(max_epochs=2, callbacks=[recorder])
    trainer.fit(Regression(), DataLoader(_Stream(), batch_size=None))
    assert [b[3] for b in recorder.batches] == [False, False, True] * 2
    assert recorder.epoch_ends == [(0, True, 0), (1, True, 0)]


def test_log_metrics_from_a_callback_reaches_the_loggers_with_the_epoch(tmp_path: Path) -> None:
    class LogsSomething(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            trainer.log_metrics({"custom": 1.5 + trainer.current_epoch, "as_tensor": torch.tensor(2.0)})

    trainer = quiet_trainer(
        max_epochs=2, callbacks=[LogsSomething()], logger=CSVLogger(tmp_path), log_every_n_steps=100
    )
    trainer.fit(Regression(), loader())
    assert trainer.logged_metrics["custom"] == 2.5
    with open(Path(trainer.log_dir, "metrics.csv")) as file:
        rows = [row for row in csv.DictReader(file) if row.get("custom")]
    assert [(row["epoch"], row["custom"], row["as_tensor"], row["step"]) for row in rows] == [
        ("0", "1.5", "2.0", "8"),
        ("1", "2.5", "2.0", "16"),
    ]


def test_devices_scaler_and_callback_lists() -> None:
    trainer = quiet_trainer()
    assert (trainer.device_ids, trainer.num_devices) == ([0], 1)
    assert trainer.scaler is None
    assert trainer.early_stopping_callbacks == [] and trainer.early_stopping_callback is None
    two = dt.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    assert (two.device_ids, two.num_devices) == ([0, 1], 2)

    stoppers = [EarlyStopping("a"), EarlyStopping("b")]
    trainer = quiet_trainer(callbacks=stoppers)
    assert trainer.early_stopping_callbacks == stoppers
    assert trainer.early_stopping_callback is stoppers[0]

    double = quiet_trainer(precision="64-true")
    with double.init_module():
        module = Regression()
    assert {p.dtype for p in module.parameters()} == {torch.float64}
    with double.init_module(empty_init=True):
        torch.manual_seed(0)
        skipped = torch.nn.Linear(3, 3)
    assert skipped.weight.dtype == torch.float64


def test_scaler_is_the_precisions_grad_scaler() -> None:
    from drivetrain.plugins import MixedPrecision

    precision = MixedPrecision("16-mixed", device="cpu")
    trainer = quiet_trainer(plugins=[precision])
    assert isinstance(trainer.scaler, torch.amp.GradScaler)
    assert trainer.scaler is precision.scaler


def test_print_writes_on_rank_zero_only(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = quiet_trainer()
    trainer.print("hello", 3, sep="-")
    assert capsys.readouterr().out == "hello-3\n"
    monkeypatch.setattr(type(trainer.strategy), "is_global_zero", property(lambda self: False))
    trainer.print("hidden")
    assert capsys.readouterr().out == ""


def test_ckpt_path_reports_and_selects_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=-1, filename="{epoch}")
    trainer = quiet_trainer(max_epochs=2, callbacks=[checkpoint], enable_checkpointing=True)
    model = Regression()
    trainer.fit(model, loader(), loader())
    assert trainer.ckpt_path is None  # this fit started fresh
    first = str(tmp_path / "epoch=0.ckpt")

    trainer.ckpt_path = first
    trainer.validate(model, loader(), verbose=False)
    assert trainer.ckpt_path == first
    weights = torch.load(first, weights_only=True)["state_dict"]
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in weights.items())

    trainer.test(model, loader(), ckpt_path="best", verbose=False)  # an explicit argument wins
    assert trainer.ckpt_path == checkpoint.best_model_path
    trainer.ckpt_path = None
    trainer.test(model, loader(), verbose=False)
    assert trainer.ckpt_path is None
    with pytest.raises(TypeError, match=r"trainer\.ckpt_path = 3: use a path"):
        trainer.ckpt_path = 3
