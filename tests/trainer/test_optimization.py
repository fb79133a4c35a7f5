"""Optimizers and schedulers: manual optimisation, closures, scheduler intervals and frequencies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from drivetrain.plugins import MixedPrecision
from drivetrain.trainer import Callback
from trainer.trainer_models import (
    Regression,
    assert_same_weights,
    loader,
    quiet_trainer,
    weights,
)


class TwoOptimizerGAN(Regression):
    """Manual optimisation with two optimizers, stepping each on alternate batches."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.other = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        first, second = self.optimizers()
        x, y = batch
        optimizer, model = (first, self.net) if batch_idx % 2 == 0 else (second, self.other)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        optimizer.step()
        scheduler = self.lr_schedulers()
        if batch_idx % 2 == 0:
            scheduler.step()
        self.log("loss", loss)

    def configure_optimizers(self) -> Any:
        first = torch.optim.SGD(self.net.parameters(), lr=0.1)
        second = torch.optim.SGD(self.other.parameters(), lr=0.2)
        return [first, second], [torch.optim.lr_scheduler.StepLR(first, 1, gamma=0.5)]


def test_manual_optimisation_matches_by_hand() -> None:
    torch.manual_seed(0)
    model = TwoOptimizerGAN()
    reference = TwoOptimizerGAN()
    reference.load_state_dict(model.state_dict())
    first = torch.optim.SGD(reference.net.parameters(), lr=0.1)
    second = torch.optim.SGD(reference.other.parameters(), lr=0.2)
    scheduler = torch.optim.lr_scheduler.StepLR(first, 1, gamma=0.5)
    for index, (x, y) in enumerate(loader()):
        optimizer, part = (first, reference.net) if index % 2 == 0 else (second, reference.other)
        optimizer.zero_grad()
        nn.functional.mse_loss(part(x), y).backward()
        torch.nn.utils.clip_grad_norm_(
            [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None], 0.5
        )
        optimizer.step()
        if index % 2 == 0:
            scheduler.step()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model, loader())
    assert_same_weights(weights(model), weights(reference))
    assert trainer.global_step == 8  # each optimizer.step() counts
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr() == scheduler.get_last_lr()


def test_lbfgs_runs_through_a_closure_like_by_hand() -> None:
    class WithLBFGS(Regression):
        def configure_optimizers(self) -> Any:
            return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=4)

    torch.manual_seed(0)
    model = WithLBFGS()
    reference = WithLBFGS()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.LBFGS(reference.parameters(), lr=0.1, max_iter=4)
    for _ in range(2):
        for x, y in loader(batch_size=32):

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(reference(x), y)
                loss.backward()
                return loss

            optimizer.step(closure)
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(model, loader(batch_size=32))
    assert_same_weights(weights(model), weights(reference))
    assert trainer.global_step == 4


@pytest.mark.parametrize(
    ("interval", "frequency", "expected_steps"), [("step", 1, 16), ("step", 3, 5), ("epoch", 1, 2)]
)
def test_scheduler_interval_and_frequency(interval: str, frequency: int, expected_steps: int) -> None:
    class Scheduled(Regression):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda count: 1.0 / (count + 1))
            return [optimizer], [{"scheduler": scheduler, "interval": interval, "frequency": frequency}]

    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(Scheduled(), loader())
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1.0 / (expected_steps + 1))


def test_plateau_scheduler_reads_the_monitored_metric() -> None:
    class Plateau(Regression):
        def on_validation_epoch_end(self) -> None:
            self.log("flat", 1.0)

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
            return {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "flat"}

    trainer = quiet_trainer(max_epochs=3, limit_train_batches=1)
    trainer.fit(Plateau(), loader(), loader())
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.25)  # no improvement after epoch 0


def test_gradients_are_there_before_the_optimizer_step() -> None:
    norms: list[float] = []

    class Watch(Regression):
        def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
            norms.append(float(torch.cat([p.grad.flatten() for p in self.parameters()]).norm()))

    quiet_trainer(max_steps=3).fit(Watch(), loader())
    assert len(norms) == 3 and all(n > 0 for n in norms)


class OverflowAtBatch(Regression):
    """A per-step LambdaLR; the loss of batch 1 is infinite, so under "16-mixed" its step is skipped."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("inf") if batch_idx == 1 else loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class HookedOverflowAtBatch(OverflowAtBatch):
    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        optimizer.step(closure=optimizer_closure)


@pytest.mark.parametrize("module", [OverflowAtBatch, HookedOverflowAtBatch], ids=["fast path", "hooked path"])
def test_a_step_the_loss_scaler_skipped_does_not_advance_per_step_schedules(module: type[Regression]) -> None:
    skipped: list[bool] = []

    class Skipped(Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            skipped.append(trainer.precision_plugin.last_step_skipped)

    torch.manual_seed(0)
    # A loss scale of 1: only the infinite loss of batch 1 overflows.
    precision = MixedPrecision("16-mixed", device="cpu", scaler_kwargs={"init_scale": 1.0})
    trainer = quiet_trainer(max_steps=4, plugins=[precision], callbacks=[Skipped()])
    trainer.fit(module(), loader())
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert skipped == [False, True, False, False]
    assert trainer.global_step == 4  # the skipped step counts, as in Lightning
    assert scheduler.last_epoch == 3  # the schedule moved on for the 3 steps the optimizer took
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


EPOCH_SCHEDULERS = Path(__file__).parent / "scripts" / "epoch_schedulers.py"


@pytest.mark.timeout(300)
def test_epoch_schedulers_step_where_lightning_steps_them(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Right after the epoch's last optimizer step (before its batch-end hook and validation), ReduceLROnPlateau
    after on_train_epoch_end, and not at all when max_steps ends the fit inside an epoch: the learning rate every
    hook sees equals Lightning 2.6's (one program run on both)."""
    import importlib.util
    import json

    from helpers.peers import lightning_results_file

    theirs = json.loads(
        lightning_results_file(EPOCH_SCHEDULERS, "epoch-schedulers", request, tmp_path_factory).read_text()
    )
    spec = importlib.util.spec_from_file_location("epoch_schedulers", EPOCH_SCHEDULERS)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ours = script.run_all("drivetrain")
    assert ours == theirs
    assert ours["max_steps_mid_epoch"][-1] == "train_end: 0.05"  # epoch 1 was cut short: no second step


class ManualPlateau(Regression):
    """Lightning's manual-optimisation recipe: the module steps its ReduceLROnPlateau itself, no monitor given."""

    def __init__(self) -> None:
        super().__init__(lr=0.1)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        optimizer.step()

    def on_train_epoch_end(self) -> None:
        self.lr_schedulers().step(1.0)  # never improves: halved after each epoch past the first

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return [optimizer], [torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)]


def test_manual_optimisation_steps_its_own_reduce_on_plateau_without_a_monitor() -> None:
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=2)
    trainer.fit(ManualPlateau(), loader())
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.025)
    with pytest.raises(
        ValueError, match="ReduceLROnPlateau steps on a metric"
    ):  # automatic: the Trainer steps it
        module = ManualPlateau()
        module.automatic_optimization = True
        quiet_trainer(max_epochs=1).fit(module, loader())
