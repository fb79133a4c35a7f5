"""Inputs a new user gets wrong, through both front doors: each is a clear error (what, what is allowed, the fix).

None of these checks costs anything per training step: each runs once at set-up, or only once torch
has already refused (a backward, a state dict), or on the first batch of an epoch.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import drivetrain as dt
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

pytestmark = pytest.mark.faults


def _accelerated(model: nn.Module | None = None) -> tuple[dt.Accelerator, nn.Module, Any]:
    accelerator = dt.Accelerator(cpu=True)
    model = model if model is not None else nn.Linear(4, 1)
    prepared, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return accelerator, prepared, optimizer


# -- a collate_fn that returns None -----------------------------------------------------------------
def _none_batches() -> DataLoader:
    return DataLoader(regression_data(8), batch_size=4, collate_fn=lambda items: None)


def test_trainer_a_none_batch_that_training_step_cannot_take_is_named() -> None:
    with (
        pytest.warns(UserWarning, match=r"batch 0 of epoch 0 is None: its collate_fn returned None"),
        pytest.raises(
            TypeError, match=r"The training batch 0 is None, and training_step failed on it .*collate_fn"
        ),
    ):
        quiet_trainer(max_steps=2).fit(Regression(), _none_batches())


def test_accelerator_a_none_batch_is_pointed_out_before_the_loop_fails_on_it() -> None:
    accelerator = dt.Accelerator(cpu=True)
    batches = accelerator.prepare(_none_batches())
    with pytest.warns(UserWarning, match=r"batch 0 of epoch 0 is None: its collate_fn returned None"):
        assert next(iter(batches)) is None


# -- a model without parameters ---------------------------------------------------------------------
class NoParameters(dt.TrainingModule):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return batch[0].sum() * 0

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_a_module_without_parameters_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"NoParameters has none \(nothing to train\)\. Create its layers in __init__"
    ):
        quiet_trainer(max_steps=1).fit(NoParameters(), loader())


# -- a loss that is not one number ------------------------------------------------------------------
class VectorLoss(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y, reduction="none")


VECTOR = r"backward needs the loss as one number, but it has shape \({}, 1\) \({} values\)\. Reduce it first"


def test_trainer_a_vector_loss_is_named() -> None:
    with pytest.raises(ValueError, match=VECTOR.format(8, 8)):
        quiet_trainer(max_steps=1).fit(VectorLoss(), loader())


def test_accelerator_a_vector_loss_is_named() -> None:
    accelerator, model, _ = _accelerated()
    with pytest.raises(ValueError, match=VECTOR.format(3, 3)):
        accelerator.backward(model(torch.randn(3, 4)))


# -- backward twice through one graph ---------------------------------------------------------------
class TwiceBackward(Regression):
    automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        self.manual_backward(loss)


TWICE = r"backward ran a second time through a graph the first backward already freed"


def test_trainer_backward_twice_is_named() -> None:
    with pytest.raises(RuntimeError, match=TWICE):
        quiet_trainer(max_steps=1).fit(TwiceBackward(), loader())


def test_accelerator_backward_twice_is_named() -> None:
    accelerator, model, _ = _accelerated()
    loss = model(torch.randn(3, 4)).sum()
    accelerator.backward(loss)
    with pytest.raises(RuntimeError, match=TWICE):
        accelerator.backward(loss)


# -- weights of another size on load ----------------------------------------------------------------
MISFIT = r"The checkpoint's weights do not fit {}: {}: \({}\) in the checkpoint, \({}\) in the model\. .* Build the model"


def test_trainer_a_checkpoint_of_another_model_size_is_named(tmp_path: Path) -> None:
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(Regression(), loader())
    trainer.save_checkpoint(tmp_path / "four.ckpt")
    bigger = Regression(features=5)
    with pytest.raises(ValueError, match=MISFIT.format("Regression", r"net\.0\.weight", "8, 4", "8, 5")):
        quiet_trainer(max_steps=2).fit(
            bigger, loader(regression_data(features=5)), ckpt_path=tmp_path / "four.ckpt"
        )
    with pytest.raises(
        ValueError, match=r"load_from_checkpoint\('.*four\.ckpt'\): The checkpoint's weights do not fit"
    ):
        Regression.load_from_checkpoint(tmp_path / "four.ckpt", features=5)


def test_accelerator_a_state_of_another_model_size_is_named(tmp_path: Path) -> None:
    accelerator, _, _ = _accelerated()
    accelerator.save_state(tmp_path / "state")
    other, _, _ = _accelerated(nn.Linear(5, 1))
    with pytest.raises(ValueError, match=MISFIT.format("Linear", "weight", "1, 4", "1, 5")):
        other.load_state(tmp_path / "state")


# -- an optimizer over another model's parameters (trained nothing, silently) ---------------------------
class OptimizesAnotherModel(Regression):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(nn.Linear(4, 1).parameters(), lr=0.1)


def test_trainer_an_optimizer_over_another_models_parameters_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"SGD over 2 parameter\(s\), none of which belongs to OptimizesAnotherModel"
    ):
        quiet_trainer(max_steps=2).fit(OptimizesAnotherModel(), loader())


def test_accelerator_an_optimizer_over_another_models_parameters_is_refused() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model, other = nn.Linear(4, 1), nn.Linear(4, 1)
    with pytest.raises(
        ValueError, match=r"SGD over 2 parameter\(s\), none of which belongs to a prepared model"
    ):
        accelerator.prepare(model, torch.optim.SGD(other.parameters(), lr=0.1))
    # A model and its optimizer prepared in separate calls are fine.
    model = accelerator.prepare(model)
    accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))


def test_the_checks_leave_correct_programs_alone() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet_trainer(max_steps=2).fit(Regression(), loader())
        accelerator, model, optimizer = _accelerated()
        accelerator.backward(model(torch.randn(3, 4)).sum())
        optimizer.step()
