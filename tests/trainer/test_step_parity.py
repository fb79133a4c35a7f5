"""The training step as Lightning users meet it on the fast step path (no step hook overridden).

``on_train_batch_end`` gets ``outputs`` as Lightning passes them (``{"loss": detached loss}``), and
the gradients are zeroed at the start of an accumulation window, right after ``training_step``, so
they are still readable after the optimizer step. The hook order is checked against real Lightning
(``hook_order.py`` run on the peers' interpreter, ``benchmarks/.peers-venv``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from drivetrain.trainer.callbacks import Callback
from drivetrain.trainer.loop_hooks import STEP_HOOKS
from helpers.peers import lightning_results_file
from helpers.peers import peers_python as lightning_python
from helpers.scripts import run_command
from trainer.hook_order import GENERAL_PATH_HOOKS, record, record_with_callbacks
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

SCRIPT = Path(__file__).parent / "hook_order.py"


class Outputs(Callback):
    """Records ``outputs`` of every ``on_train_batch_end`` the way a Lightning callback reads them."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append(outputs)


class Returning(Regression):
    """Returns the loss as ``kind`` says; records the loss of each batch."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.losses.append(loss.detach().clone())
        if self.kind == "dict":
            return {"loss": loss, "batch_size": len(batch[0])}
        if self.kind == "skip" and batch_idx == 1:
            return None
        return loss


@pytest.mark.parametrize("kind", ["tensor", "dict", "skip"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_batch_end_outputs_are_lightnings_dict(kind: str, accumulate: int) -> None:
    module, callback = Returning(kind), Outputs()
    quiet_trainer(
        max_epochs=1, limit_train_batches=4, accumulate_grad_batches=accumulate, callbacks=[callback]
    ).fit(module, loader(batch_size=8))
    assert len(callback.seen) == 4
    for batch_idx, (outputs, loss) in enumerate(zip(callback.seen, module.losses)):
        if kind == "skip" and batch_idx == 1:
            assert outputs == {}
            continue
        assert isinstance(outputs, dict)
        expected_keys = ["loss", "batch_size"] if kind == "dict" else ["loss"]
        assert list(outputs) == expected_keys
        # Detached, and divided by the accumulation as for the backward pass (Lightning's normalisation).
        assert not outputs["loss"].requires_grad
        torch.testing.assert_close(outputs["loss"], loss / accumulate)
        if kind == "dict":
            assert outputs["batch_size"] == 8


class Manual(Regression):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.kind = kind

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.manual_backward(loss)
        optimizer.step()
        if self.kind == "dict":
            return {"loss": loss, "note": "kept"}
        return loss if self.kind == "tensor" else None


@pytest.mark.parametrize("kind", ["tensor", "dict", "none"])
def test_manual_optimisation_batch_end_outputs(kind: str) -> None:
    callback = Outputs()
    quiet_trainer(max_epochs=1, limit_train_batches=2, callbacks=[callback]).fit(Manual(kind), loader())
    assert len(callback.seen) == 2
    for outputs in callback.seen:
        if kind == "none":
            assert outputs == {}
            continue
        assert set(outputs) == ({"loss", "note"} if kind == "dict" else {"loss"})
        assert isinstance(outputs["loss"], torch.Tensor) and not outputs["loss"].requires_grad


def test_manual_optimisation_refuses_other_step_outputs() -> None:
    class Listing(Manual):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return [super().training_step(batch, batch_idx)]

    with pytest.raises(TypeError, match=r"training_step returned list\. With automatic_optimization = False"):
        quiet_trainer(max_epochs=1, limit_train_batches=2).fit(Listing("tensor"), loader())


class Gradients(Callback):
    """Copies the first layer's gradient after every batch (None when there is none)."""

    def __init__(self) -> None:
        self.grads: list[torch.Tensor | None] = []
        self.zeroed_before_backward: list[bool] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        grad = module.net[0].weight.grad
        self.grads.append(None if grad is None else grad.clone())

    def on_before_backward(self, trainer: Any, module: Any, loss: torch.Tensor) -> None:
        self.zeroed_before_backward.append(module.net[0].weight.grad is None)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_gradients_stay_readable_after_the_step(accumulate: int) -> None:
    """As in Lightning: zeroing happens when the next window starts, so batch-end hooks see this window's sum."""
    torch.manual_seed(0)
    module, callback = Regression(lr=0.0), Gradients()  # lr 0: the weights (and so the gradients) do not move
    data = regression_data(32)
    trainer = quiet_trainer(
        max_epochs=1, limit_train_batches=4, accumulate_grad_batches=accumulate, callbacks=[callback]
    )
    trainer.fit(module, loader(data, batch_size=8))
    assert trainer.run_state.optimization.step == trainer.run_state.optimization._automatic_step
    # Each batch's own gradient of the (accumulation-divided) loss, computed by hand.
    per_batch = []
    for index in range(4):
        x, y = data[index * 8 : (index + 1) * 8]
        module.zero_grad()
        (nn.functional.mse_loss(module(x), y) / accumulate).backward()
        per_batch.append(module.net[0].weight.grad.clone())
    expected = [
        sum(per_batch[index - index % accumulate : index + 1], torch.zeros_like(per_batch[0]))
        for index in range(4)
    ]
    assert all(grad is not None for grad in callback.grads)
    for grad, want in zip(callback.grads, expected):
        torch.testing.assert_close(grad, want)
        assert grad.abs().sum() > 0
    # Zeroed (set to None) before the backward of each window's first batch, kept inside a window.
    assert callback.zeroed_before_backward == [index % accumulate == 0 for index in range(4)]


@pytest.fixture(scope="module")
def peers_python() -> Path:
    return lightning_python()


def lightning_hook_order(
    arguments: list[str], python: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> Any:
    """``hook_order.py lightning *arguments`` run under Lightning, once per script version (pytest's cache)."""
    key = hashlib.sha256(SCRIPT.read_bytes() + f"{python}{arguments}".encode()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir(f"hook-order-{key}") if cache is not None else tmp_path
    recorded = folder / "lightning.json"
    if not recorded.exists():
        completed = run_command([str(python), str(SCRIPT), "lightning", *arguments], timeout=240)
        assert completed.returncode == 0, completed.stderr[-3000:]
        fresh = folder / f"new-{os.getpid()}.json"  # xdist workers may fill the same entry at once
        fresh.write_text(completed.stdout.strip().splitlines()[-1])
        fresh.replace(recorded)
    return json.loads(recorded.read_text())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("accumulate", [1, 2])
def test_fast_path_hook_order_is_lightnings(
    accumulate: int, peers_python: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    assert set(GENERAL_PATH_HOOKS) == set(STEP_HOOKS)  # the recorder leaves exactly these alone
    lightning = lightning_hook_order([str(accumulate), "fast"], peers_python, request, tmp_path)
    ours = record("drivetrain", accumulate, fast_path=True)
    assert ours == lightning
    # Not vacuous: the zeroing hook runs between training_step and the backward of each window's first batch.
    first = ours.index("on_before_zero_grad")
    assert ours[first - 1] == "training_step" and ours[first + 1] == "on_before_backward"
    assert ours.count("on_before_zero_grad") == 2 // accumulate


@pytest.mark.timeout(300)
def test_module_and_callback_hook_order_is_lightnings(
    peers_python: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Module and callbacks (a plain one, EarlyStopping, ModelCheckpoint) in Lightning's order through fit,
    validate, test, predict and a resumed fit: callbacks before the module, the ``*_end`` hooks included,
    except the monitoring callbacks after the module at ``on_train_epoch_end``."""
    lightning = lightning_hook_order(["callbacks"], peers_python, request, tmp_path)
    ours = record_with_callbacks("drivetrain")
    assert ours == lightning
    # Not vacuous: the three orders that matter are in the recording.
    end = ours.index("callback:on_train_end")
    assert ours[end : end + 4] == [
        "callback:on_train_end", "early_stopping:on_train_end", "checkpoint:on_train_end", "module:on_train_end",
    ]  # fmt: skip
    epoch_end = ours.index("callback:on_train_epoch_end")
    assert ours[epoch_end : epoch_end + 4] == [
        "callback:on_train_epoch_end", "module:on_train_epoch_end", "early_stopping:on_train_epoch_end",
        "checkpoint:on_train_epoch_end",
    ]  # fmt: skip
    assert {"--- fit", "--- validate", "--- test", "--- predict", "--- resume"} <= set(ours)


OUTPUTS_SCRIPT = Path(__file__).parent / "scripts" / "batch_end_outputs.py"


@pytest.mark.timeout(300)
def test_batch_end_loss_is_lightnings_under_accumulation(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``outputs["loss"]`` equals Lightning's (divided once by the accumulation), for a callback and the module,
    on the fast and the general step path, with a window cut short by the data's end (5 batches)."""
    theirs = torch.load(
        lightning_results_file(OUTPUTS_SCRIPT, "batch-end-outputs", request, tmp_path_factory),
        weights_only=True,
    )
    spec = importlib.util.spec_from_file_location("batch_end_outputs", OUTPUTS_SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ours = script.run_all("drivetrain")
    assert ours.keys() == theirs.keys()
    for (case, accumulate, _, _), seen in zip(script.CASES, ours.values()):
        torch.testing.assert_close(seen, theirs[case], msg=case)
        assert seen["callback"] == seen["module"]
        assert seen["callback"] == pytest.approx([loss / accumulate for loss in seen["returned"]], rel=1e-6)


def test_batch_end_loss_follows_an_accumulation_schedule() -> None:
    """The loss handed to the batch-end hook is the one backward got, also after the factor changes."""
    from drivetrain.trainer.callbacks import GradientAccumulationScheduler

    module, callback = Returning("dict"), Outputs()
    quiet_trainer(
        max_epochs=3,
        limit_train_batches=4,
        callbacks=[callback, GradientAccumulationScheduler(scheduling={0: 2, 1: 1, 2: 4})],
    ).fit(module, loader(batch_size=8))
    factors = [2] * 4 + [1] * 4 + [4] * 4
    assert len(callback.seen) == len(module.losses) == len(factors)
    for outputs, loss, factor in zip(callback.seen, module.losses, factors):
        torch.testing.assert_close(outputs["loss"], loss / factor)
        assert not outputs["loss"].requires_grad and outputs["batch_size"] == 8
