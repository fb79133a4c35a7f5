"""BaseFinetuning / BackboneFinetuning: frozen until the epoch, then a new parameter group; resume keeps the groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from drivetrain.trainer.callbacks import BackboneFinetuning, BaseFinetuning, Callback, ModelCheckpoint
from trainer.callback_models import Backboned, params
from trainer.trainer_models import loader, quiet_trainer, regression_data


class EpochRecorder(Callback):
    """The backbone's weights and the optimizer's groups as each epoch starts training (after unfreezing)."""

    def __init__(self) -> None:
        self.backbone: list[dict[str, torch.Tensor]] = []
        self.groups: list[list[tuple[float, int]]] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.backbone.append(params(pl_module.backbone))
            self.groups.append([(g["lr"], len(g["params"])) for g in trainer.optimizers[0].param_groups])


def _fit(
    finetuning: Callback, max_epochs: int = 4, **kwargs: Any
) -> tuple[Backboned, EpochRecorder, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Backboned(lr=0.1, **kwargs)
    initial = params(model.backbone)
    recorder = EpochRecorder()
    quiet_trainer(max_epochs=max_epochs, callbacks=[finetuning, recorder]).fit(
        model, loader(regression_data(32), batch_size=8)
    )
    return model, recorder, initial


def test_the_backbone_stays_bit_identical_until_it_unfreezes_then_trains_in_its_own_group() -> None:
    model, recorder, initial = _fit(
        BackboneFinetuning(
            unfreeze_backbone_at_epoch=2, backbone_initial_ratio_lr=0.1, lambda_func=lambda epoch: 2.0
        )
    )
    # Epochs 0, 1 and the start of 2 see the initial backbone; by the end it has trained.
    for epoch in range(3):
        assert all(torch.equal(recorder.backbone[epoch][k], initial[k]) for k in initial), epoch
    assert not torch.equal(params(model.backbone)["0.weight"], initial["0.weight"])
    # Head only at first; at epoch 2 the backbone's 2 tensors join with 0.1 x the head's rate, then it doubles
    # (capped at the head's rate: should_align).
    assert recorder.groups[:2] == [[(0.1, 2)], [(0.1, 2)]]
    assert recorder.groups[2] == [(0.1, 2), (pytest.approx(0.01), 2)]
    assert recorder.groups[3] == [(0.1, 2), (pytest.approx(0.02), 2)]
    assert all(p.requires_grad for p in model.backbone.parameters())


def test_backbone_lr_without_alignment_and_with_a_fixed_start() -> None:
    finetuning = BackboneFinetuning(
        unfreeze_backbone_at_epoch=1,
        backbone_initial_lr=0.08,
        lambda_func=lambda epoch: 2.0,
        should_align=False,
    )
    _, recorder, _ = _fit(finetuning)
    assert [groups[-1][0] for groups in recorder.groups[1:]] == pytest.approx([0.08, 0.16, 0.32])


def test_batch_norm_stays_trainable_or_frozen_as_asked() -> None:
    for train_bn in (True, False):
        model, _recorder, initial = _fit(
            BackboneFinetuning(unfreeze_backbone_at_epoch=5, train_bn=train_bn), 2, batch_norm=True
        )
        norm = model.backbone[1]
        assert isinstance(norm, nn.BatchNorm1d)
        assert norm.weight.requires_grad is train_bn
        assert not model.backbone[0].weight.requires_grad
        assert torch.equal(model.backbone[0].weight, initial["0.weight"])
        assert norm.track_running_stats is train_bn


class UnfreezeInSteps(BaseFinetuning):
    """A user's subclass: the first layer at epoch 1 (a tenth of the rate), the BatchNorm layer at epoch 2."""

    def freeze_before_training(self, pl_module: Any) -> None:
        self.freeze(pl_module.backbone, train_bn=False)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        if epoch == 1:
            self.unfreeze_and_add_param_group(pl_module.backbone[0], optimizer)
        if epoch == 2:
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr=0.003)


def test_a_subclass_adds_groups_and_a_resumed_fit_rebuilds_them(tmp_path: Path) -> None:
    def run(name: str, ckpt_path: Path | None) -> tuple[dict[str, torch.Tensor], EpochRecorder]:
        torch.manual_seed(0)
        model = Backboned(lr=0.1, batch_norm=True)
        recorder = EpochRecorder()
        checkpoint = ModelCheckpoint(
            dirpath=tmp_path / name, every_n_train_steps=3, save_top_k=-1, filename="{step}"
        )
        trainer = quiet_trainer(
            max_epochs=4, callbacks=[UnfreezeInSteps(), recorder, checkpoint], enable_checkpointing=True
        )
        trainer.fit(model, loader(regression_data(32), batch_size=8, shuffle=True), ckpt_path=ckpt_path)
        return {k: v.clone() for k, v in model.state_dict().items()}, recorder

    full, recorder = run("full", None)
    # initial_denom_lr=10 by default: the first group's rate / 10; then the BatchNorm layer's 2 tensors (the
    # first layer's are in the optimizer already: not added twice).
    assert recorder.groups[1] == [(0.1, 2), (pytest.approx(0.01), 2)]
    assert recorder.groups[2] == [(0.1, 2), (pytest.approx(0.01), 2), (0.003, 2)]
    for step in ("step=9.ckpt", "step=12.ckpt"):  # after each unfreezing, mid-epoch and at an epoch's end
        resumed, _ = run(f"resumed-{step}", tmp_path / "full" / step)
        assert all(torch.equal(full[k], resumed[k]) for k in full), step


def test_misuse_is_reported() -> None:
    class Headless(Backboned):
        def __init__(self) -> None:
            super().__init__()
            del self.backbone
            self.trunk = nn.Linear(4, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.trunk(x))

    with pytest.raises(ValueError, match="backbone"):
        quiet_trainer(max_epochs=1, callbacks=[BackboneFinetuning()]).fit(
            Headless(), loader(regression_data(8))
        )
    with pytest.raises(NotImplementedError, match="freeze_before_training"):
        quiet_trainer(max_epochs=1, callbacks=[BaseFinetuning()]).fit(Backboned(), loader(regression_data(8)))
    with pytest.raises(ValueError, match="unfreeze_backbone_at_epoch"):
        BackboneFinetuning(unfreeze_backbone_at_epoch=-1)
    with pytest.raises(TypeError, match="lambda_func"):
        BackboneFinetuning(lambda_func=2.0)
