"""``Trainer.fit(torch.compile(model))``: the Trainer runs the TrainingModule with its compiled forward."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data, weights


def test_fit_unwraps_a_compiled_module_and_trains_with_its_compiled_forward() -> None:
    calls = {"graphs": 0, "compiled_forwards": 0}

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        calls["graphs"] += 1

        def run(*args: Any) -> Any:
            calls["compiled_forwards"] += 1
            return graph.forward(*args)

        return run

    torch.manual_seed(0)
    model = Regression()
    reference = copy.deepcopy(model)
    train, val = loader(regression_data(32)), loader(regression_data(16))  # 4 and 2 batches
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(torch.compile(model, backend=counting_backend), train, val)
    assert trainer.training_module is model
    # Every forward of training (2 x 4) and validation (2 x 2) ran through the compiled code.
    assert calls["compiled_forwards"] == 12 and calls["graphs"] >= 1
    assert "forward" not in model.__dict__  # the module is itself again after fit
    quiet_trainer(max_epochs=2).fit(reference, train, val)
    for name, value in weights(reference).items():
        torch.testing.assert_close(weights(model)[name], value, rtol=1e-5, atol=1e-6)
    # validate() without a model runs the one fit ran, compiled as it was given; the plain module runs eagerly.
    before = calls["compiled_forwards"]
    trainer.validate(dataloaders=val, verbose=False)
    assert calls["compiled_forwards"] == before + 2
    trainer.validate(model, val, verbose=False)
    assert calls["compiled_forwards"] == before + 2


def test_a_compiled_module_that_is_not_a_training_module_is_a_clear_error() -> None:
    with pytest.raises(
        TypeError,
        match=r"expects a drivetrain.TrainingModule, got "
        r"torch.compile\(Linear\)",
    ):
        quiet_trainer().fit(torch.compile(nn.Linear(2, 2), backend="eager"))
