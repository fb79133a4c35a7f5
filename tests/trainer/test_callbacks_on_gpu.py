"""The averaging, fine-tuning and pruning callbacks with the model on a GPU; skipped where CUDA is absent."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.optim.swa_utils import update_bn

from drivetrain.trainer.callbacks import (
    BackboneFinetuning,
    EMAWeightAveraging,
    ModelPruning,
    StochasticWeightAveraging,
)
from trainer.callback_models import Backboned, Snapshots, assert_close, mean, params
from trainer.trainer_models import loader, quiet_trainer, regression_data

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _cpu(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.cpu() for key, value in weights.items()}


def test_swa_averages_on_the_cpu_for_a_model_on_the_gpu() -> None:
    torch.manual_seed(0)
    model = Backboned(batch_norm=True)
    snapshots = Snapshots()
    data = loader(regression_data(32), batch_size=8)
    swa = StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2)  # the average lives on the CPU (default)
    quiet_trainer(accelerator="gpu", devices=1, max_epochs=3, callbacks=[swa, snapshots]).fit(model, data)
    assert next(model.parameters()).device.type == "cuda"
    assert_close(_cpu(params(model)), _cpu(mean(snapshots.epoch_end[1:])))
    expected = copy.deepcopy(model)
    update_bn(data, expected, device=torch.device("cuda"))
    torch.testing.assert_close(model.backbone[1].running_var, expected.backbone[1].running_var)


def test_ema_on_the_gpu_follows_its_formula() -> None:
    torch.manual_seed(0)
    model = Backboned()
    snapshots = Snapshots()
    trainer = quiet_trainer(
        accelerator="gpu", devices=1, max_epochs=1, callbacks=[EMAWeightAveraging(decay=0.5), snapshots]
    )
    trainer.fit(model, loader(regression_data(32), batch_size=8))
    expected = dict(snapshots.after_step[0])
    for weights in snapshots.after_step[1:]:
        expected = {k: 0.5 * expected[k] + 0.5 * weights[k] for k in expected}
    assert_close(_cpu(params(model)), _cpu(expected))


def test_finetuning_and_pruning_on_the_gpu() -> None:
    torch.manual_seed(0)
    model = Backboned()
    initial = params(model.backbone)
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=5)
    pruning = ModelPruning(
        "l1_unstructured", amount=0.5, use_global_unstructured=False, parameter_names=["weight"]
    )
    quiet_trainer(accelerator="gpu", devices=1, max_epochs=2, callbacks=[finetuning, pruning]).fit(
        model, loader(regression_data(32), batch_size=8)
    )
    assert model.head.weight.device.type == "cuda"
    assert float((model.head.weight == 0).float().mean()) == 0.75  # half, then half of the rest
    assert not any(key.endswith("_orig") for key in model.state_dict())
    # Frozen throughout: only the pruning (and the lottery-ticket reset to these values) touched it.
    weight = model.backbone[0].weight.detach().cpu()
    kept = weight != 0
    assert torch.equal(weight[kept], initial["0.weight"].cpu()[kept])
