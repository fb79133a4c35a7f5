"""ModelPruning: the fraction of zeros each epoch, no reparametrisation left at the end, checkpoints, lottery ticket."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from drivetrain.trainer.callbacks import Callback, ModelCheckpoint, ModelPruning
from trainer.callback_models import Backboned, params
from trainer.trainer_models import loader, quiet_trainer, regression_data


class Sparsity(Callback):
    """The fraction of zeros in each pruned weight after every epoch's pruning (it runs after ModelPruning)."""

    def __init__(self, names: tuple[str, ...] = ("backbone.0.weight", "head.weight")) -> None:
        self.names = names
        self.fractions: list[dict[str, float]] = []
        self.reparametrised: list[bool] = []

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        modules = dict(pl_module.named_modules())
        row = {}
        for name in self.names:
            owner, attribute = name.rsplit(".", 1)
            row[name] = float((getattr(modules[owner], attribute) == 0).float().mean())
        self.fractions.append(row)
        self.reparametrised.append(any(key.endswith("_orig") for key in pl_module.state_dict()))


def _fit(pruning: ModelPruning, max_epochs: int = 3, **kwargs: Any) -> tuple[Backboned, Sparsity]:
    torch.manual_seed(0)
    model = Backboned()
    sparsity = Sparsity()
    callbacks: list[Callback] = [pruning, sparsity]
    quiet_trainer(max_epochs=max_epochs, callbacks=callbacks, **kwargs).fit(
        model, loader(regression_data(32), batch_size=8)
    )
    return model, sparsity


def _reparametrisation_left(model: nn.Module) -> bool:
    hooks = any(
        isinstance(h, prune.BasePruningMethod) for m in model.modules() for h in m._forward_pre_hooks.values()
    )
    return hooks or any(k.endswith(("_orig", "_mask")) for k in model.state_dict())


def test_each_layer_loses_the_fraction_asked_each_epoch_and_no_reparametrisation_is_left() -> None:
    pruning = ModelPruning(
        "l1_unstructured", amount=0.5, use_global_unstructured=False, parameter_names=["weight"]
    )
    model, sparsity = _fit(pruning)
    # 0.5 of what is left each epoch: 1/2, 3/4, 7/8 of each weight (32 and 8 entries).
    for epoch, expected in enumerate((0.5, 0.75, 0.875)):
        assert sparsity.fractions[epoch] == {"backbone.0.weight": expected, "head.weight": expected}
        assert sparsity.reparametrised[epoch]
    assert not _reparametrisation_left(model)
    assert float((model.backbone[0].weight == 0).float().mean()) == 0.875
    assert float((model.head.bias == 0).float().mean()) == 0.0  # not named: untouched


def test_global_pruning_with_an_amount_per_epoch_and_a_schedule() -> None:
    pruning = ModelPruning(
        "l1_unstructured",
        amount=lambda epoch: 10 * (epoch + 1),  # entries, across all the weights and biases together
        apply_pruning=lambda epoch: epoch != 1,
        use_lottery_ticket_hypothesis=False,
    )
    model, _ = _fit(pruning)
    total_zeros = sum(int((p == 0).sum()) for p in model.parameters())
    assert total_zeros == 10 + 30  # epoch 0: 10, epoch 1 skipped, epoch 2: 30 more
    assert not _reparametrisation_left(model)


def test_structured_pruning_removes_whole_rows() -> None:
    pruning = ModelPruning(
        "ln_structured",
        parameter_names=["weight"],
        use_global_unstructured=False,
        amount=0.25,
        pruning_dim=0,
        pruning_norm=2,
        make_pruning_permanent=True,
    )
    model, _ = _fit(pruning, max_epochs=1)
    zero_rows = int((model.backbone[0].weight.abs().sum(dim=1) == 0).sum())
    assert zero_rows == 2  # a quarter of the 8 output rows


def test_lottery_ticket_resets_the_surviving_weights_to_their_initial_values() -> None:
    torch.manual_seed(0)
    initial = params(Backboned())
    pruning = ModelPruning(
        "l1_unstructured",
        amount=0.5,
        use_global_unstructured=False,
        use_lottery_ticket_hypothesis=True,
        parameter_names=["weight"],
    )
    model, _ = _fit(pruning, max_epochs=1)
    for name in ("backbone.0.weight", "head.weight"):
        pruned = params(model)[name]
        kept = pruned != 0
        assert torch.equal(pruned[kept], initial[name][kept])
        assert float((~kept).float().mean()) == 0.5


def test_checkpoints_hold_the_pruned_weights_under_their_own_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pruning = ModelPruning(
        "random_unstructured",
        amount=0.5,
        use_global_unstructured=False,
        parameter_names=["weight"],
        verbose=2,
    )
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    torch.manual_seed(0)
    model = Backboned()
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        quiet_trainer(max_epochs=2, callbacks=[pruning, checkpoint], enable_checkpointing=True).fit(
            model, loader(regression_data(32), batch_size=8)
        )
    saved = torch.load(tmp_path / "epoch=0.ckpt", weights_only=True)["state_dict"]
    assert set(saved) == set(Backboned().state_dict())
    assert float((saved["head.weight"] == 0).float().mean()) == 0.5
    fresh = Backboned()
    fresh.load_state_dict(saved)  # loads into an unpruned model
    assert "ModelPruning: Linear.weight: 0 -> 16 zeros of 32" in caplog.text
    assert "zeros of 40" in caplog.text  # the overall line


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="not a known method"):
        ModelPruning("l3_unstructured")
    with pytest.raises(ValueError, match="pruning_dim"):
        ModelPruning("ln_structured", pruning_norm=2, use_global_unstructured=False)
    with pytest.raises(ValueError, match="structured"):
        ModelPruning("random_structured", pruning_dim=0, use_global_unstructured=True)
    with pytest.raises(ValueError, match="fraction"):
        ModelPruning("l1_unstructured", amount=1.5)
    with pytest.raises(ValueError, match="use_global_unstructured=False"):
        ModelPruning(lambda module, name, amount: None)
    with pytest.raises(ValueError, match="parameter_names"):
        ModelPruning("l1_unstructured", parameter_names=["gamma"])
    with pytest.raises(ValueError, match="not part of the model"):
        quiet_trainer(
            max_epochs=1,
            callbacks=[ModelPruning("l1_unstructured", parameters_to_prune=[(nn.Linear(2, 2), "weight")])],
        ).fit(Backboned(), loader(regression_data(8)))


def test_the_default_parameters_to_prune_are_every_named_parameter() -> None:
    model = Backboned(batch_norm=True)
    pairs = ModelPruning.sanitize_parameters_to_prune(model, parameter_names=["weight"])
    assert pairs == [(model.backbone[0], "weight"), (model.backbone[1], "weight"), (model.head, "weight")]
    assert len(ModelPruning.sanitize_parameters_to_prune(model)) == 6  # weights and biases
