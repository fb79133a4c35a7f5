"""TrainingModule's Lightning helpers: freeze, optimizer toggling, example_input_array in the summary, export."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from drivetrain.trainer import ModelSummary
from trainer.trainer_models import Regression, loader, quiet_trainer


def test_freeze_and_unfreeze() -> None:
    model = Regression()
    model.freeze()
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    model.unfreeze()
    assert model.training and all(p.requires_grad for p in model.parameters())


class TwoOptimizers(Regression):
    """A GAN-like pair: each optimizer steps its half, the other half must get no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.head = nn.Linear(1, 1)
        self.head.bias.requires_grad = False  # a frozen parameter stays frozen through toggling
        self.seen: list[tuple[bool, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        first, second = self.optimizers()
        x, y = batch
        for optimizer in (first, second):
            with self.toggled_optimizer(optimizer) if optimizer is second else _Toggle(self, optimizer):
                self.seen.append(tuple(p.requires_grad for p in self.parameters()))
                optimizer.zero_grad()
                self.manual_backward(nn.functional.mse_loss(self(x), y))
                optimizer.step()
        self.seen.append(tuple(p.requires_grad for p in self.parameters()))

    def configure_optimizers(self) -> Any:
        return (
            torch.optim.SGD(self.net.parameters(), lr=0.01),
            torch.optim.SGD(self.head.parameters(), lr=0.01),
        )


class _Toggle:
    def __init__(self, module: Any, optimizer: Any) -> None:
        self.module, self.optimizer = module, optimizer

    def __enter__(self) -> None:
        self.module.toggle_optimizer(self.optimizer)

    def __exit__(self, *args: Any) -> None:
        self.module.untoggle_optimizer(self.optimizer)


def test_toggle_optimizer_limits_gradients_to_its_parameters() -> None:
    model = TwoOptimizers()
    quiet_trainer(max_steps=4).fit(model, loader())  # 2 batches: each optimizer step counts
    net = 4  # net's parameters (2 layers x weight, bias), then head.weight, head.bias
    only_net = (True,) * net + (False, False)
    only_head = (False,) * net + (True, False)
    restored = (True,) * net + (True, False)
    assert model.seen[:3] == [only_net, only_head, restored]
    assert len(model.seen) == 6 and model.seen[3:] == model.seen[:3]


class Summarised(Regression):
    def __init__(self) -> None:
        super().__init__()
        self.example_input_array = torch.zeros(5, 4)


@pytest.mark.parametrize("precision", ["32-true", "64-true"])
def test_the_summary_shows_layer_sizes_for_an_example_input(
    caplog: pytest.LogCaptureFixture, precision: str
) -> None:
    model = Summarised()
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        quiet_trainer(
            max_steps=1, callbacks=[ModelSummary(max_depth=2)], enable_model_summary=True, precision=precision
        ).fit(model, loader())
    (table,) = [r.getMessage() for r in caplog.records if r.name.endswith("model_summary")]
    lines = table.splitlines()
    assert "In sizes" in lines[0] and "Out sizes" in lines[0]
    row = next(line for line in lines if "net.0" in line)
    assert "[5, 4]" in row and "[5, 8]" in row
    assert "Input: [5, 4]  Output: [5, 1]" in table
    assert model.training  # the example ran in eval mode and the mode came back


def test_to_torchscript_script_and_trace(tmp_path: Path) -> None:
    model = Summarised()
    x = torch.randn(3, 4)
    with pytest.warns(DeprecationWarning):  # torch deprecates TorchScript; Lightning's method stays
        scripted = model.to_torchscript(tmp_path / "model.pt")
    assert torch.allclose(scripted(x), model(x))
    with pytest.warns(DeprecationWarning):
        loaded = torch.jit.load(tmp_path / "model.pt")
    assert torch.allclose(loaded(x), model(x))
    with pytest.warns(DeprecationWarning):
        traced = model.to_torchscript(method="trace")  # traced with example_input_array
    assert torch.allclose(traced(x), model(x))
    with pytest.raises(ValueError, match="use 'script' or 'trace'"):
        model.to_torchscript(method="compile")
    with pytest.raises(ValueError, match=r"set self\.example_input_array"):
        Regression().to_torchscript(method="trace")


@pytest.mark.skipif(
    importlib.util.find_spec("onnx") is not None and importlib.util.find_spec("onnxscript") is not None,
    reason="onnx is installed: the export itself is tested",
)
def test_to_onnx_names_the_missing_package(tmp_path: Path) -> None:
    with pytest.raises(ModuleNotFoundError, match="pip install onnx"):
        Summarised().to_onnx(tmp_path / "model.onnx")


@pytest.mark.skipif(
    importlib.util.find_spec("onnx") is None or importlib.util.find_spec("onnxscript") is None,
    reason="torch's ONNX exporter needs onnx and onnxscript, not installed here",
)
def test_to_onnx_exports(tmp_path: Path) -> None:  # pragma: no cover - where onnx is installed
    import onnx

    Summarised().to_onnx(tmp_path / "model.onnx")
    onnx.checker.check_model(onnx.load(tmp_path / "model.onnx"))


class Extended(Regression):
    """The saved model plus a layer the checkpoint does not have."""

    strict_loading = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra = nn.Linear(1, 1)


def test_strict_loading_false_loads_differing_weights(tmp_path: Path) -> None:
    from drivetrain.trainer import ModelCheckpoint

    saved = Regression()
    checkpoint = ModelCheckpoint(dirpath=tmp_path)
    quiet_trainer(max_epochs=1, callbacks=[checkpoint], enable_checkpointing=True).fit(saved, loader())
    path = checkpoint.best_model_path

    loaded = Extended.load_from_checkpoint(path)
    assert torch.equal(loaded.net[0].weight, saved.net[0].weight)
    with pytest.raises(RuntimeError, match="Missing key"):
        Extended.load_from_checkpoint(path, strict=True)

    model = Extended()
    extra = model.extra.weight.detach().clone()
    quiet_trainer().validate(model, loader(), ckpt_path=path, verbose=False)
    assert torch.equal(model.net[0].weight, saved.net[0].weight) and torch.equal(model.extra.weight, extra)
    with pytest.raises(ValueError, match="strict_loading is False, but resuming fit"):
        quiet_trainer(max_epochs=2).fit(Extended(), loader(), ckpt_path=path)

    strict = Extended()
    strict.strict_loading = True
    with pytest.raises(RuntimeError, match="Missing key"):
        quiet_trainer().validate(strict, loader(), ckpt_path=path, verbose=False)
