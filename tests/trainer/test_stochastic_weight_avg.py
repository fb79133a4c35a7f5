"""StochasticWeightAveraging: the average of the SWA epochs' weights, the SWA learning rate, BatchNorm, resume, DDP."""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import update_bn

from drivetrain.trainer.callbacks import BackboneFinetuning, ModelCheckpoint, StochasticWeightAveraging
from helpers.multiprocess import run_processes
from trainer.callback_models import Backboned, Snapshots, assert_close, mean, params
from trainer.trainer_models import loader, quiet_trainer, regression_data


def _anneal(strategy: str, t: float) -> float:
    return t if strategy == "linear" else (1 - math.cos(math.pi * t)) / 2


@pytest.mark.parametrize(("swa_epoch_start", "strategy"), [(3, "linear"), (0.6, "cos")])
def test_the_model_ends_with_the_mean_of_the_swa_epochs_weights(swa_epoch_start: Any, strategy: str) -> None:
    torch.manual_seed(0)
    model = Backboned(lr=0.05, scheduler=True)  # StepLR halves the rate every epoch until SWA takes over
    snapshots = Snapshots()
    swa = StochasticWeightAveraging(
        swa_lrs=0.01, swa_epoch_start=swa_epoch_start, annealing_epochs=2, annealing_strategy=strategy
    )
    trainer = quiet_trainer(max_epochs=5, callbacks=[swa, snapshots])
    trainer.fit(model, loader(regression_data(32), batch_size=8))
    # Epochs 2, 3 and 4 (0-based) are the SWA epochs (the third of five; 0.6 * 5 = 3 as well).
    assert_close(params(model), mean(snapshots.epoch_end[2:]))
    start = 0.05 * 0.5**2  # StepLR's rate when SWA starts
    expected = [0.05, 0.025] + [start + (0.01 - start) * _anneal(strategy, min(1.0, j / 2)) for j in range(3)]
    assert [lrs[0] for lrs in snapshots.epoch_lrs] == pytest.approx(expected, rel=1e-6)
    # The module's scheduler paused during SWA, and is its own again afterwards.
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
    assert scheduler.last_epoch == 2


def test_batch_norm_statistics_are_recomputed_for_the_averaged_weights() -> None:
    torch.manual_seed(0)
    model = Backboned(batch_norm=True)
    snapshots = Snapshots()
    trainer = quiet_trainer(
        max_epochs=4, callbacks=[StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2), snapshots]
    )
    data = loader(regression_data(32), batch_size=8)
    trainer.fit(model, data)
    assert_close(params(model), mean(snapshots.epoch_end[1:]))
    expected = copy.deepcopy(model)
    update_bn(data, expected)  # PyTorch's own pass over the same batches
    batch_norm, reference = model.backbone[1], expected.backbone[1]
    assert isinstance(batch_norm, nn.BatchNorm1d)
    torch.testing.assert_close(batch_norm.running_mean, reference.running_mean)
    torch.testing.assert_close(batch_norm.running_var, reference.running_var)
    assert batch_norm.momentum == 0.1  # put back after the pass


@pytest.mark.parametrize("resume_from", ["step=15.ckpt", "step=12.ckpt", "step=6.ckpt"])
def test_a_resumed_fit_ends_with_the_same_weights(tmp_path: Path, resume_from: str) -> None:
    """From the middle of an SWA epoch, the end of one (before the next update), and before SWA started."""

    def run(name: str, ckpt_path: Path | None) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = Backboned(batch_norm=True, scheduler=True)
        checkpoint = ModelCheckpoint(
            dirpath=tmp_path / name, every_n_train_steps=3, save_top_k=-1, filename="{step}"
        )
        swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=3, annealing_epochs=3)
        trainer = quiet_trainer(max_epochs=5, callbacks=[checkpoint, swa], enable_checkpointing=True)
        trainer.fit(model, loader(regression_data(32), batch_size=8, shuffle=True), ckpt_path=ckpt_path)
        return {k: v.clone() for k, v in model.state_dict().items()}

    full = run("full", None)
    resumed = run("resumed", tmp_path / "full" / resume_from)
    assert all(torch.equal(full[k], resumed[k]) for k in full)


def test_a_fit_that_ends_before_swa_keeps_its_weights(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = Backboned()
    snapshots = Snapshots()
    trainer = quiet_trainer(
        max_epochs=4,
        max_steps=6,
        callbacks=[StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=3), snapshots],
    )
    with caplog.at_level(logging.WARNING, logger="drivetrain"):
        trainer.fit(model, loader(regression_data(32), batch_size=8))
    assert_close(params(model), snapshots.after_step[-1])
    assert "before SWA started" in caplog.text


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="swa_lrs"):
        StochasticWeightAveraging(swa_lrs=0)
    with pytest.raises(ValueError, match="swa_epoch_start=0"):
        StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=0)
    with pytest.raises(ValueError, match=r"swa_epoch_start=1.5"):
        StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=1.5)
    with pytest.raises(ValueError, match="annealing_strategy"):
        StochasticWeightAveraging(swa_lrs=0.1, annealing_strategy="step")
    with pytest.raises(ValueError, match="annealing_epochs"):
        StochasticWeightAveraging(swa_lrs=0.1, annealing_epochs=-1)
    data = loader(regression_data(16), batch_size=8)
    late = quiet_trainer(max_epochs=2, callbacks=[StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=3)])
    with pytest.raises(ValueError, match="starts after the last epoch"):
        late.fit(Backboned(), data)
    groups = quiet_trainer(
        max_epochs=2, callbacks=[StochasticWeightAveraging(swa_lrs=[0.1, 0.2], swa_epoch_start=1)]
    )
    with pytest.raises(ValueError, match="1 parameter group"):
        groups.fit(Backboned(), data)
    endless = quiet_trainer(max_epochs=-1, max_steps=4, callbacks=[StochasticWeightAveraging(swa_lrs=0.1)])
    with pytest.raises(ValueError, match="needs max_epochs"):
        endless.fit(Backboned(), data)


def _ddp(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Backboned(batch_norm=True)
    snapshots = Snapshots()
    swa = StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2, annealing_epochs=1)
    trainer = quiet_trainer(strategy="ddp", devices=2, max_epochs=4, callbacks=[swa, snapshots])
    trainer.fit(model, loader(regression_data(64), batch_size=4, shuffle=True))
    torch.manual_seed(0)
    tuned = Backboned()
    initial = params(tuned.backbone)
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_initial_lr=0.01)
    quiet_trainer(strategy="ddp", devices=2, max_epochs=3, callbacks=[finetuning]).fit(
        tuned, loader(regression_data(64), batch_size=4, shuffle=True)
    )
    return {
        "swa": {k: v.clone() for k, v in model.state_dict().items()},
        "snapshots": snapshots.epoch_end,
        "backbone": params(tuned.backbone),
        "backbone_moved": not all(torch.equal(initial[k], v) for k, v in params(tuned.backbone).items()),
    }


@pytest.mark.multiprocess
def test_under_ddp_every_process_ends_with_the_same_averaged_model() -> None:
    """SWA (BatchNorm statistics averaged over the processes) and an unfrozen backbone stay identical on both ranks."""
    ranks = run_processes(_ddp, 2, timeout=120)
    first, second = ranks
    for key in first["swa"]:
        assert torch.equal(first["swa"][key], second["swa"][key]), key
    assert_close(params_of(first["swa"], first["snapshots"][0]), mean(first["snapshots"][1:]))
    # Each rank saw different batches, so the statistics are the combination of both passes.
    assert int(first["swa"]["backbone.1.num_batches_tracked"]) == 16
    assert first["backbone_moved"]
    for key in first["backbone"]:
        assert torch.equal(first["backbone"][key], second["backbone"][key]), key


def params_of(state: dict[str, torch.Tensor], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: state[key] for key in like}
