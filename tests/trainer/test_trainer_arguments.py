"""Lightning's Trainer arguments ``min_steps``, ``detect_anomaly``, ``overfit_batches``,
``reload_dataloaders_every_n_epochs`` and ``barebones``: each has the effect Lightning documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.trainer.callbacks import Callback
from helpers.peers import peers_python
from helpers.scripts import run_command
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


class StopAtOnce(Callback):
    """Asks to stop after every batch (as early stopping would)."""

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        trainer.should_stop = True


def test_min_steps_holds_off_a_stop_request_until_reached() -> None:
    data = loader(regression_data(32), batch_size=8)  # 4 steps per epoch
    trainer = quiet_trainer(max_epochs=5, min_steps=6, callbacks=[StopAtOnce()])
    trainer.fit(Regression(), data)
    assert trainer.global_step == 6  # into the second epoch, then the stop is honoured at once
    trainer = quiet_trainer(max_epochs=5, callbacks=[StopAtOnce()])
    trainer.fit(Regression(), data)
    assert trainer.global_step == 1
    with pytest.raises(ValueError, match="min_steps=5 is more than max_steps=3"):
        quiet_trainer(max_steps=3, min_steps=5)
    with pytest.raises(ValueError, match="min_steps=-1"):
        quiet_trainer(min_steps=-1)


class NanGradient(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self(batch[0]) * 0).sqrt().sum()  # sqrt'(0) = inf, times 0: NaN in the backward pass


def test_detect_anomaly_names_the_operation_that_produced_nan() -> None:
    data = loader(regression_data(8), batch_size=8)
    with pytest.raises(RuntimeError, match=r"Function '\w+Backward0' returned nan values"):
        quiet_trainer(max_epochs=1, detect_anomaly=True).fit(NanGradient(), data)
    quiet_trainer(max_epochs=1).fit(NanGradient(), data)  # off by default: the NaN goes unnoticed
    assert not torch.is_anomaly_enabled()
    with pytest.raises(TypeError, match="detect_anomaly expects True or False"):
        quiet_trainer(detect_anomaly="yes")


class SeenBatches(Regression):
    """Records the first input value of every training and validation batch, per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.train_seen: dict[int, list[float]] = {}
        self.val_seen: dict[int, list[float]] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.train_seen.setdefault(self.current_epoch, []).append(float(batch[0][0, 0]))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_seen.setdefault(self.current_epoch, []).append(float(batch[0][0, 0]))
        super().validation_step(batch, batch_idx)


@pytest.mark.parametrize(("overfit", "val_batches"), [(2, 2), (0.25, 1)])
def test_overfit_batches_repeats_the_first_batches_in_order(overfit: int | float, val_batches: int) -> None:
    train, val = regression_data(64, seed=1), regression_data(32, seed=2)  # 8 and 4 batches of 8
    model = SeenBatches()
    trainer = quiet_trainer(max_epochs=3, overfit_batches=overfit)
    with pytest.warns(UserWarning, match="the train dataloader shuffles; it is read in order instead"):
        trainer.fit(model, loader(train, shuffle=True), loader(val))
    first_two = [float(train.tensors[0][0, 0]), float(train.tensors[0][8, 0])]
    assert model.train_seen == {epoch: first_two for epoch in range(3)}
    # Validation uses the first batches of the validation loader (Lightning 2.x): 2, or a quarter of its 4.
    first_val = [float(val.tensors[0][0, 0]), float(val.tensors[0][8, 0])][:val_batches]
    assert model.val_seen == {epoch: first_val for epoch in range(3)}
    assert trainer.num_training_batches == 2 and trainer.num_val_batches == [val_batches]
    assert trainer.overfit_batches == overfit and trainer.global_step == 6


def test_overfit_batches_bad_values_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"overfit_batches=-1; use 0 \(off\), a number of batches"):
        quiet_trainer(overfit_batches=-1)
    with pytest.raises(ValueError, match=r"overfit_batches=1.5; use 0 \(off\).* a fraction in \(0, 1\]"):
        quiet_trainer(overfit_batches=1.5)
    with pytest.raises(TypeError, match=r"overfit_batches expects an int \(batches\) or a float"):
        quiet_trainer(overfit_batches="2")
    with pytest.raises(
        ValueError, match=r"overfit_batches=2 sets how many .* limit_train_batches=5 would be"
    ):
        quiet_trainer(overfit_batches=2, limit_train_batches=5)


class Reloading(Regression):
    """Each call of a dataloader hook returns a bigger dataset: call n has n batches."""

    def __init__(self) -> None:
        super().__init__()
        self.train_calls = self.val_calls = 0
        self.train_batches: list[float] = []
        self.val_batches: list[list[float]] = []

    def train_dataloader(self) -> Any:
        self.train_calls += 1
        return loader(regression_data(8 * self.train_calls, seed=self.train_calls), batch_size=8)

    def val_dataloader(self) -> Any:
        self.val_calls += 1
        return loader(regression_data(8 * self.val_calls, seed=10 + self.val_calls), batch_size=8)

    def on_train_epoch_end(self) -> None:
        self.train_batches.append(self.trainer.num_training_batches)

    def on_validation_epoch_end(self) -> None:
        self.val_batches.append(self.trainer.num_val_batches)


def test_reload_dataloaders_every_n_epochs_calls_the_hooks_again() -> None:
    model = Reloading()
    trainer = quiet_trainer(max_epochs=5, reload_dataloaders_every_n_epochs=2)
    trainer.fit(model)
    # Loaded at the start (epoch 0), then again in epochs 2 and 4; each new loader is the one used.
    assert (model.train_calls, model.val_calls) == (3, 3)
    assert model.train_batches == [1, 1, 2, 2, 3]
    assert model.val_batches == [[1], [1], [2], [2], [3]]
    assert trainer.global_step == 1 + 1 + 2 + 2 + 3
    model = Reloading()
    quiet_trainer(max_epochs=3).fit(model)  # the default: once per fit
    assert (model.train_calls, model.val_calls, model.train_batches) == (1, 1, [1, 1, 1])
    with pytest.raises(ValueError, match=r"reload_dataloaders_every_n_epochs=-1; use an int >= 0"):
        quiet_trainer(reload_dataloaders_every_n_epochs=-1)


class CountingCallback(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1


class CountingValidation(Regression):
    def __init__(self) -> None:
        super().__init__()
        self.validation_steps = 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_steps += 1
        super().validation_step(batch, batch_idx)


def test_barebones_runs_without_logging_checkpoints_bar_summary_or_sanity_check(tmp_path: Any) -> None:
    import drivetrain as dt

    counter = CountingCallback()
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=1,
        barebones=True,
        max_epochs=2,
        default_root_dir=tmp_path,
        callbacks=[counter],
    )
    assert trainer.barebones and trainer.loggers == [] and trainer.callbacks == [counter]
    model = CountingValidation()
    with pytest.warns(
        UserWarning, match=r"self.log\('(train|val)_loss', ...\) does nothing under Trainer\(barebones=True\)"
    ):
        trainer.fit(model, loader(regression_data(32)), loader(regression_data(16)))
    assert trainer.global_step == 8 and counter.batches == 8  # the user's callbacks still run
    assert model.validation_steps == 2 * 2  # two epochs of two batches, no sanity check before
    assert trainer.callback_metrics == {} and trainer.logged_metrics == {}
    assert list(tmp_path.iterdir()) == []  # no checkpoint, no log folder


@pytest.mark.parametrize(
    "setting",
    [
        {"enable_checkpointing": True},
        {"enable_progress_bar": True},
        {"enable_model_summary": True},
        {"logger": True},
        {"logger": "csv"},
        {"log_every_n_steps": 10},
        {"num_sanity_val_steps": 2},
        {"fast_dev_run": True},
        {"detect_anomaly": True},
        {"profiler": "simple"},
    ],
)
def test_barebones_with_a_feature_it_turns_off_is_an_error(setting: dict[str, Any]) -> None:
    import drivetrain as dt

    ((name, value),) = setting.items()
    with pytest.raises(
        ValueError, match=rf"Trainer\(barebones=True, {name}={value!r}\).* cannot be honoured"
    ):
        dt.Trainer(accelerator="cpu", devices=1, barebones=True, **setting)
    # Settings that agree with barebones are accepted.
    dt.Trainer(
        accelerator="cpu",
        devices=1,
        barebones=True,
        logger=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )


def test_barebones_with_a_checkpoint_callback_is_an_error() -> None:
    import drivetrain as dt
    from drivetrain.trainer import ModelCheckpoint

    with pytest.raises(
        ValueError, match=r"barebones=True\) runs without a checkpoint callback.*ModelCheckpoint"
    ):
        dt.Trainer(accelerator="cpu", devices=1, barebones=True, callbacks=[ModelCheckpoint()])


def test_a_default_root_dir_that_is_not_a_path_is_named() -> None:
    with pytest.raises(
        TypeError, match=r"default_root_dir=5 \(int\) is not a path\. Pass a str or a pathlib\.Path"
    ):
        dt.Trainer(default_root_dir=5)  # type: ignore[arg-type]


def test_the_settings_are_trainer_attributes_as_in_lightning() -> None:
    """``trainer.limit_train_batches`` & co. hold what Lightning's hold (fast_dev_run and overfit_batches included);
    ``min_epochs``/``min_steps`` are 0 where Lightning has None when unset (docs/migrating-from-lightning.md)."""
    script = Path(__file__).parent / "scripts" / "trainer_attributes.py"
    completed = run_command([str(peers_python()), str(script), "lightning"], timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    theirs = json.loads(completed.stdout.strip().splitlines()[-1])
    namespace: dict[str, Any] = {}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    ours = namespace["attributes"]("drivetrain")
    for config, mine, reference in zip(namespace["CONFIGS"], ours, theirs):
        for name in ("min_epochs", "min_steps"):
            if name not in config:
                assert (mine[name], reference[name]) == (["int", 0], ["NoneType", None])
                del mine[name], reference[name]
        assert mine == reference, config
