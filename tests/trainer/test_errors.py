"""Mistakes are reported with what was wrong, what is allowed and how to fix it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.trainer import Callback, EarlyStopping, ModelCheckpoint, TQDMProgressBar
from trainer.trainer_models import Regression, loader, quiet_trainer


class NoStep(dt.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class NoOptimizer(Regression):
    configure_optimizers = dt.TrainingModule.configure_optimizers


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"val_check_interval": 1.5},
            ValueError,
            r"val_check_interval=1.5 is a fraction of an epoch outside \(0, 1\]",
        ),
        (
            {"val_check_interval": 0},
            ValueError,
            r"val_check_interval=0; an int counts training batches and must be >= 1",
        ),
        (
            {"check_val_every_n_epoch": None},
            ValueError,
            r"check_val_every_n_epoch=None .* needs an int val_check_interval",
        ),
        ({"limit_train_batches": 1.5}, ValueError, r"limit_train_batches=1.5 is a fraction outside \[0, 1\]"),
        ({"limit_val_batches": -1}, ValueError, r"limit_val_batches=-1 is negative"),
        ({"max_epochs": -2}, ValueError, r"max_epochs=-2 is not allowed; use an int >= -1"),
        ({"min_epochs": 5, "max_epochs": 2}, ValueError, r"min_epochs=5 is more than max_epochs=2"),
        (
            {"accumulate_grad_batches": 0},
            ValueError,
            r"accumulate_grad_batches=0 is not allowed; use an int >= 1",
        ),
        ({"gradient_clip_algorithm": "value"}, ValueError, r"'value' does nothing without gradient_clip_val"),
        ({"gradient_clip_val": 1.0, "gradient_clip_algorithm": "l1"}, ValueError, r"use 'norm' or 'value'"),
        ({"max_time": "12 hours"}, ValueError, r"max_time='12 hours'; write it as 'DD:HH:MM:SS'"),
        ({"deterministic": "yes"}, ValueError, r"deterministic='yes'; use True, False, 'warn' or None"),
        (
            {"callbacks": [object()]},
            TypeError,
            r"callbacks= expects drivetrain Callback instances, got object",
        ),
        (
            {"logger": "comet"},
            ValueError,
            r"logger='comet' names the logger 'comet', which is unknown. logger= accepts a logger name \('csv'",
        ),
        (
            {"enable_progress_bar": False, "callbacks": [TQDMProgressBar()]},
            ValueError,
            r"enable_progress_bar=False but callbacks= contains a progress bar",
        ),
        (
            {"enable_checkpointing": False, "callbacks": [ModelCheckpoint()]},
            ValueError,
            r"enable_checkpointing=False but callbacks= contains a checkpoint callback",
        ),
        (
            {"accelerator": "gpu"},
            ValueError,
            r"accelerator='gpu' was requested but no GPU backend was found here",
        ),
        (
            {"accelerator": "tpu9"},
            ValueError,
            r"Unknown accelerator 'tpu9'\. Did you mean 'tpu'\? Available: .*cpu",
        ),
        ({"strategy": "ddp_magic"}, ValueError, r"Unknown strategy 'ddp_magic'\. Available: .*ddp_spawn"),
    ],
)
def test_bad_trainer_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        dt.Trainer(**kwargs)


def test_seed_gpu_example_fails_clearly_without_a_gpu() -> None:
    from drivetrain.strategies import DDPStrategy

    with pytest.raises(
        ValueError, match=r"accelerator='gpu' was requested but no GPU backend was found here"
    ):
        dt.Trainer(strategy=DDPStrategy(static_graph=True), accelerator="gpu", devices=4)


def test_module_without_training_step_or_optimizer() -> None:
    with pytest.raises(ValueError, match=r"NoStep does not define training_step\(self, batch, batch_idx\)"):
        quiet_trainer().fit(NoStep(), loader())
    with pytest.raises(ValueError, match=r"NoOptimizer does not define configure_optimizers\(self\)"):
        quiet_trainer().fit(NoOptimizer(), loader())
    with pytest.raises(TypeError, match=r"expects a drivetrain.TrainingModule, got Linear"):
        quiet_trainer().fit(nn.Linear(2, 2), loader())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"NoStep does not define test_step"):
        quiet_trainer().test(NoStep(), loader())


@pytest.mark.parametrize(
    ("returned", "error", "match"),
    [
        (None, TypeError, r"configure_optimizers\(\) returned None; return an optimizer"),
        ("adam", TypeError, r"returned str \('adam'\)"),
        ({"optimizer": "x"}, TypeError, r"a dict without an 'optimizer' entry holding an optimizer"),
        ({"opt": 1}, TypeError, r"unknown key\(s\) 'opt'"),
    ],
)
def test_bad_configure_optimizers(returned: Any, error: type, match: str) -> None:
    class Bad(Regression):
        def configure_optimizers(self) -> Any:
            return returned

    with pytest.raises(error, match=match):
        quiet_trainer().fit(Bad(), loader())


def test_scheduler_and_optimizer_combinations() -> None:
    class TwoOptimizers(Regression):
        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters())]

    with pytest.raises(ValueError, match=r"returned 2 optimizers; automatic optimisation steps exactly one"):
        quiet_trainer().fit(TwoOptimizers(), loader())

    class Plateau(Regression):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {
                "optimizer": optimizer,
                "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer),
            }

    with pytest.raises(ValueError, match=r"ReduceLROnPlateau steps on a metric; name it with"):
        quiet_trainer().fit(Plateau(), loader())

    class BadInterval(Regression):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "batch"}}

    with pytest.raises(ValueError, match=r"interval='batch'; use 'step' or 'epoch'"):
        quiet_trainer().fit(BadInterval(), loader())


def test_val_check_interval_larger_than_the_epoch() -> None:
    with pytest.raises(
        ValueError, match=r"val_check_interval=20 is more than the 8 training batches of an epoch"
    ):
        quiet_trainer(val_check_interval=20).fit(Regression(), loader(), loader())


def test_monitor_that_is_never_logged(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val_los")
    with pytest.raises(
        ValueError,
        match=r"ModelCheckpoint\(monitor='val_los'\) found no logged metric 'val_los' "
        r"\(logged: .*val_loss.*\)\. Log it with self.log\('val_los', value\)",
    ):
        quiet_trainer(callbacks=[checkpoint], enable_checkpointing=True).fit(Regression(), loader(), loader())
    with pytest.raises(ValueError, match=r"EarlyStopping\(monitor='vall_loss'\) found no logged metric"):
        quiet_trainer(callbacks=[EarlyStopping("vall_loss")]).fit(Regression(), loader(), loader())
    with pytest.raises(ValueError, match=r"filename='\{epoch\}-\{acc\}'\) names 'acc', which was not logged"):
        quiet_trainer(
            callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{acc}")], enable_checkpointing=True
        ).fit(Regression(), loader())


def test_checkpoint_callback_arguments() -> None:
    with pytest.raises(
        ValueError, match=r"save_top_k=3, monitor=None\) cannot rank checkpoints without a metric"
    ):
        ModelCheckpoint(save_top_k=3)
    with pytest.raises(ValueError, match=r"ModelCheckpoint\(mode='lowest'\); use 'min' or 'max'"):
        ModelCheckpoint(mode="lowest")
    with pytest.raises(ValueError, match=r"these schedules exclude each other; choose one"):
        ModelCheckpoint(every_n_train_steps=5, every_n_epochs=1)


def test_checkpoint_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"ckpt_path='.*missing.ckpt' does not exist"):
        quiet_trainer().fit(Regression(), loader(), ckpt_path=tmp_path / "missing.ckpt")
    with pytest.warns(
        UserWarning,
        match=r"ckpt_path='last' was given but there is no ModelCheckpoint callback \(checkpointing is off\)",
    ):
        quiet_trainer(max_steps=1).fit(Regression(), loader(), ckpt_path="last")
    weights_only = tmp_path / "weights.ckpt"

    class SaveWeights(Callback):
        def on_train_end(self, trainer: dt.Trainer, pl_module: Any) -> None:
            trainer.save_checkpoint(weights_only, weights_only=True)

    quiet_trainer(max_steps=1, callbacks=[SaveWeights()]).fit(Regression(), loader())
    with pytest.raises(
        ValueError, match=r"Cannot resume training from .*weights.ckpt.*holds no training state"
    ):
        quiet_trainer().fit(Regression(), loader(), ckpt_path=weights_only)


def test_data_mistakes() -> None:
    with pytest.raises(ValueError, match=r"fit\(\) has no training data: pass train_dataloaders="):
        quiet_trainer().fit(Regression())
    with pytest.raises(ValueError, match=r"Pass either datamodule= or dataloaders \(train\), not both"):
        quiet_trainer().fit(Regression(), loader(), datamodule=dt.DataModule())
    with pytest.raises(TypeError, match=r"fit\(\) got 2 training loaders; it trains on one"):
        quiet_trainer().fit(Regression(), [loader(), loader()])
    # A Dataset is iterable (through __getitem__): it used to train on one unbatched sample per step.
    dataset = loader().dataset
    with pytest.raises(
        TypeError, match=r"The train dataloader is a TensorDataset, a Dataset rather than a DataLoader"
    ):
        quiet_trainer().fit(Regression(), dataset)
    with pytest.raises(
        TypeError, match=r"The val dataloader is a TensorDataset.*DataLoader\(dataset, batch_size=32\)\."
    ):
        quiet_trainer().fit(Regression(), loader(), dataset)
    with pytest.raises(TypeError, match=r"The test dataloader is a TensorDataset"):
        quiet_trainer().test(Regression(), dataset)

    class NoValidationStep(Regression):
        validation_step = dt.TrainingModule.validation_step

    with pytest.warns(
        UserWarning, match=r"Validation data was given but NoValidationStep has no validation_step"
    ):
        quiet_trainer(max_steps=1).fit(NoValidationStep(), loader(), loader())


def test_manual_optimisation_refuses_automatic_settings() -> None:
    class Manual(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

    with pytest.raises(ValueError, match=r"gradient_clip_val=1.0\) clips in automatic optimisation only"):
        quiet_trainer(gradient_clip_val=1.0).fit(Manual(), loader())
    with pytest.raises(
        ValueError, match=r"accumulate_grad_batches=2\) accumulates in automatic optimisation only"
    ):
        quiet_trainer(accumulate_grad_batches=2).fit(Manual(), loader())


def test_training_step_must_return_a_loss() -> None:
    class ReturnsString(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return "loss"

    with pytest.raises(
        TypeError, match=r"training_step returned str; return the loss tensor, a dict with a 'loss'"
    ):
        quiet_trainer().fit(ReturnsString(), loader())

    class NoLossKey(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return {"value": super().training_step(batch, batch_idx)}

    with pytest.raises(
        ValueError, match=r"training_step returned a dict without a 'loss' entry \(keys: value\)"
    ):
        quiet_trainer().fit(NoLossKey(), loader())


def test_training_data_that_yields_nothing_is_an_error_not_an_endless_loop() -> None:
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    empty = DataLoader(TensorDataset(torch.zeros(0, 4), torch.zeros(0, 1)), batch_size=4)
    with pytest.raises(ValueError, match=r"The training loader is empty \(len\(loader\) == 0"):
        quiet_trainer(max_epochs=-1, max_steps=10).fit(Regression(), empty)
    with pytest.raises(
        ValueError, match=r"limit_train_batches=0 leaves fit\(\) no batch.*trainer.validate\(\)"
    ):
        quiet_trainer(max_epochs=-1, max_steps=10, limit_train_batches=0).fit(Regression(), loader())
    with pytest.raises(
        ValueError, match=r"limit_train_batches=0.01 is a fraction of 8 batches that rounds down"
    ):
        quiet_trainer(limit_train_batches=0.01).fit(Regression(), loader())

    class Nothing(IterableDataset):
        def __iter__(self) -> Any:
            return iter([])

    with pytest.raises(ValueError, match=r"The training loader produced no batch in epoch 0"):
        quiet_trainer(max_epochs=-1, max_steps=10).fit(Regression(), DataLoader(Nothing(), batch_size=4))


def test_logging_a_tensor_of_several_values_is_an_error() -> None:
    class LogsAVector(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.log("per_class", torch.tensor([1.0, 2.0, 3.0]))
            return loss

    with pytest.raises(
        ValueError, match=r"self.log\('per_class', value\) got a tensor of shape \(3,\) \(3 elements\)"
    ):
        quiet_trainer(max_steps=1).fit(LogsAVector(), loader())


class _Accuracy(nn.Module):
    """Shaped like a torchmetrics Metric (update, compute, reset; called as metric(preds, target))."""

    def __init__(self) -> None:
        super().__init__()
        self.hits, self.seen = 0, 0

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        self.hits += int((preds == target).sum())
        self.seen += target.numel()

    def compute(self) -> torch.Tensor:
        return torch.tensor(self.hits / max(self.seen, 1))

    def reset(self) -> None:
        self.hits, self.seen = 0, 0

    def forward(self, preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.update(preds, target)
        return self.compute()


def test_logging_a_metric_object_says_to_log_its_values() -> None:
    # Lightning's self.log("acc", self.accuracy) idiom: a metric object is not a value to log here.
    class LogsTheMetric(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.close = _Accuracy()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.close(self(batch[0]).round(), batch[1].round())
            self.log("close", self.close, on_epoch=True)
            return loss

    with pytest.raises(
        TypeError, match=r"got the metric object _Accuracy; drivetrain logs values, not metric objects"
    ):
        quiet_trainer(max_steps=1).fit(LogsTheMetric(), loader())
