"""The loop hooks Lightning users override are honoured: arguments, counts, order and effect.

The expected order was recorded from Lightning 2.6.6 running the same program (a module
overriding every hook and calling ``super()``; ``tests/trainer/hook_order.py`` prints
it for either library, so the list below can be re-checked against a Lightning install).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.strategies import SingleDeviceStrategy
from drivetrain.trainer.callbacks import Callback, EarlyStopping
from trainer.hook_order import record
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

#: Recorded from Lightning 2.6.6: ``python hook_order.py lightning 1``.
LIGHTNING_ORDER = [
    "configure_callbacks", "prepare_data", "setup:fit", "configure_optimizers", "on_fit_start",
    "on_validation_model_eval", "on_validation_start", "on_validation_epoch_start", "on_before_batch_transfer",
    "transfer_batch_to_device", "on_after_batch_transfer", "on_validation_batch_start", "validation_step",
    "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_validation_model_train",
    "on_train_start", "on_train_epoch_start", "on_before_batch_transfer", "transfer_batch_to_device",
    "on_after_batch_transfer", "on_train_batch_start", "optimizer_step", "training_step", "on_before_zero_grad",
    "optimizer_zero_grad", "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step",
    "configure_gradient_clipping", "lr_scheduler_step", "on_train_batch_end", "on_before_batch_transfer",
    "transfer_batch_to_device", "on_after_batch_transfer", "on_train_batch_start", "optimizer_step",
    "training_step", "on_before_zero_grad", "optimizer_zero_grad", "on_before_backward", "backward",
    "on_after_backward", "on_before_optimizer_step", "configure_gradient_clipping", "lr_scheduler_step",
    "on_train_batch_end", "on_validation_model_eval", "on_validation_start", "on_validation_epoch_start",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer",
    "on_validation_batch_start", "validation_step", "on_validation_batch_end", "on_before_batch_transfer",
    "transfer_batch_to_device", "on_after_batch_transfer", "on_validation_batch_start", "validation_step",
    "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_validation_model_train",
    "on_train_epoch_end", "on_train_end", "on_fit_end", "teardown:fit", "--- test",
    "configure_callbacks", "prepare_data", "setup:test", "on_test_model_eval", "on_test_start",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "test_step",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "test_step",
    "on_test_end", "on_test_model_train", "teardown:test", "--- predict", "configure_callbacks",
    "prepare_data", "setup:predict", "on_predict_model_eval", "on_predict_start",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "predict_step",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "predict_step",
    "on_predict_end", "teardown:predict",
]  # fmt: skip

#: The same with accumulate_grad_batches=2 (``python hook_order.py lightning 2``).
LIGHTNING_ORDER_ACCUMULATING = [
    "configure_callbacks", "prepare_data", "setup:fit", "configure_optimizers", "on_fit_start",
    "on_validation_model_eval", "on_validation_start", "on_validation_epoch_start", "on_before_batch_transfer",
    "transfer_batch_to_device", "on_after_batch_transfer", "on_validation_batch_start", "validation_step",
    "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_validation_model_train",
    "on_train_start", "on_train_epoch_start", "on_before_batch_transfer", "transfer_batch_to_device",
    "on_after_batch_transfer", "on_train_batch_start", "training_step", "on_before_zero_grad",
    "optimizer_zero_grad", "on_before_backward", "backward", "on_after_backward", "on_train_batch_end",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "on_train_batch_start",
    "optimizer_step", "training_step", "on_before_backward", "backward", "on_after_backward",
    "on_before_optimizer_step", "configure_gradient_clipping", "lr_scheduler_step", "on_train_batch_end",
    "on_validation_model_eval", "on_validation_start", "on_validation_epoch_start", "on_before_batch_transfer",
    "transfer_batch_to_device", "on_after_batch_transfer", "on_validation_batch_start", "validation_step",
    "on_validation_batch_end", "on_before_batch_transfer", "transfer_batch_to_device",
    "on_after_batch_transfer", "on_validation_batch_start", "validation_step", "on_validation_batch_end",
    "on_validation_epoch_end", "on_validation_end", "on_validation_model_train", "on_train_epoch_end",
    "on_train_end", "on_fit_end", "teardown:fit", "--- test", "configure_callbacks",
    "prepare_data", "setup:test", "on_test_model_eval", "on_test_start",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "test_step",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "test_step",
    "on_test_end", "on_test_model_train", "teardown:test", "--- predict", "configure_callbacks",
    "prepare_data", "setup:predict", "on_predict_model_eval", "on_predict_start",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "predict_step",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer", "predict_step",
    "on_predict_end", "teardown:predict",
]  # fmt: skip


@pytest.mark.parametrize("accumulate", [1, 2])
def test_hooks_run_in_lightnings_order(accumulate: int) -> None:
    expected = LIGHTNING_ORDER if accumulate == 1 else LIGHTNING_ORDER_ACCUMULATING
    assert record("drivetrain", accumulate) == expected


# -- each hook: arguments, count and effect -------------------------------------------------------------
def _data(n: int = 32) -> Any:
    return loader(regression_data(n), batch_size=8)  # 4 batches per epoch


def _fit(module: dt.TrainingModule, **settings: Any) -> dt.Trainer:
    trainer = quiet_trainer(**{"max_epochs": 1, **settings})
    trainer.fit(module, _data())
    return trainer


def test_optimizer_step_gets_lightnings_arguments_and_can_skip_and_warm_up() -> None:
    class WarmUp(Regression):
        def __init__(self) -> None:
            super().__init__(lr=0.1)
            self.calls: list[tuple[int, int, Any, bool]] = []
            self.seen: list[torch.Tensor] = []

        def optimizer_step(
            self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
        ) -> None:
            self.calls.append((epoch, batch_idx, optimizer, callable(optimizer_closure)))
            if batch_idx == 1:
                optimizer_closure()  # forward and backward only: this batch's update is skipped
            else:
                optimizer.step(closure=optimizer_closure)
            for group in optimizer.param_groups:  # Lightning's documented warm-up recipe
                group["lr"] = 0.1 * min(1.0, (self.trainer.global_step + 1) / 4)
            self.seen.append(self.net[0].weight.detach().clone())

    module = WarmUp()
    trainer = _fit(module, max_epochs=2)
    assert [(e, b, c) for e, b, _, c in module.calls] == [(e, b, True) for e in range(2) for b in range(4)]
    stepped = module.calls[0][2]
    assert stepped.optimizer is trainer.optimizers[0]  # the optimizer, with step() routed through the Trainer
    assert trainer.global_step == 8  # counted per call of the hook, as Lightning does
    assert torch.equal(module.seen[0], module.seen[1]) and not torch.equal(module.seen[1], module.seen[2])
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1)
    assert trainer.lr_scheduler_configs == []


def test_optimizer_step_that_never_runs_the_closure_is_an_error() -> None:
    class Forgetful(Regression):
        def optimizer_step(
            self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
        ) -> None:
            optimizer.step()

    with pytest.raises(RuntimeError, match="did not run the optimizer_closure"):
        _fit(Forgetful())


def test_optimizer_zero_grad_runs_at_each_window_start_and_decides_the_reset() -> None:
    class Keeping(Regression):
        def __init__(self) -> None:
            super().__init__(lr=0.05)
            self.calls: list[tuple[int, int, Any]] = []

        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            self.calls.append((epoch, batch_idx, optimizer))  # gradients are never reset: they add up

    module = Keeping()
    torch.manual_seed(0)
    reference = Regression(lr=0.05)
    reference.load_state_dict(module.state_dict())
    trainer = _fit(module, accumulate_grad_batches=2)
    assert [(e, b) for e, b, _ in module.calls] == [(0, 0), (0, 2)]
    assert all(optimizer is trainer.optimizers[0] for _, _, optimizer in module.calls)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for batch_idx, (x, y) in enumerate(_data()):  # by hand: accumulate over 2 batches, never zero
        (nn.functional.mse_loss(reference(x), y) / 2).backward()
        if batch_idx % 2 == 1:
            optimizer.step()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(module.state_dict()[key], value)


def test_configure_gradient_clipping_gets_the_trainer_settings_and_clips_its_way() -> None:
    class ValueClipping(Regression):
        def __init__(self) -> None:
            super().__init__(lr=1.0)
            self.calls: list[tuple[Any, Any, Any]] = []

        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
        ) -> None:
            self.calls.append((optimizer, gradient_clip_val, gradient_clip_algorithm))
            self.clip_gradients(optimizer, gradient_clip_val=1e-3, gradient_clip_algorithm="value")

    module = ValueClipping()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = _fit(module, gradient_clip_val=5.0, limit_train_batches=1)
    # Lightning passes Trainer(gradient_clip_algorithm=) as given: None when unset (clipping by norm).
    assert module.calls == [(trainer.optimizers[0], 5.0, None)]
    for key, value in module.state_dict().items():  # SGD(lr=1): each change is one clipped gradient
        assert (value - before[key]).abs().max() <= 1e-3 + 1e-7


def test_lr_scheduler_step_steps_every_scheduler_with_its_metric() -> None:
    class Stepper(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, Any]] = []

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", torch.tensor(1.5))

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            self.calls.append((type(scheduler).__name__, metric))

    module = Stepper()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(module, _data())
    assert module.calls == [("StepLR", None)] * 4
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1)  # the hook did not step it

    class Plateau(Stepper):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}

    module = Plateau()
    quiet_trainer(max_epochs=2).fit(module, _data(), _data(8))
    assert module.calls == [("ReduceLROnPlateau", 1.5)] * 2


def test_backward_hook_replaces_the_backward_pass() -> None:
    class Doubled(Regression):
        def __init__(self) -> None:
            super().__init__(lr=0.05)
            self.losses: list[torch.Tensor] = []

        def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            self.losses.append(loss.detach())
            (2 * loss).backward(*args, **kwargs)

    module = Doubled()
    reference = Regression(lr=0.1)
    reference.load_state_dict(module.state_dict())
    _fit(module)
    quiet_trainer(max_epochs=1).fit(reference, _data())  # twice the gradient at lr 0.05 == once at lr 0.1
    assert len(module.losses) == 4 and all(loss.ndim == 0 for loss in module.losses)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(module.state_dict()[key], value)


def test_manual_backward_goes_through_the_backward_hook() -> None:
    class Manual(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.hooked = 0

        def training_step(self, batch: Any, batch_idx: int) -> None:
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(nn.functional.mse_loss(self(batch[0]), batch[1]))
            optimizer.step()

        def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            self.hooked += 1
            super().backward(loss, *args, **kwargs)

    module = Manual()
    _fit(module)
    assert module.hooked == 4


def test_automatic_step_hooks_of_a_manual_module_are_accepted_and_not_called_as_in_lightning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Lightning 2.6 accepts these overrides with manual optimisation (a base class shared with automatic modules
    # has them) and never calls them; they were refused here ("overrides ... which the Trainer calls in automatic
    # optimisation").
    class Manual(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(super().training_step(batch, batch_idx))
            optimizer.step()

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

        def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("not called")

        def optimizer_zero_grad(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("not called")

        def lr_scheduler_step(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("not called")

        def configure_gradient_clipping(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("not called")

    module = Manual()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        _fit(module)
    assert module.global_step > 0 and any(
        not torch.equal(v, module.state_dict()[k]) for k, v in before.items()
    )
    (told,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Manual overrides")]
    assert "which the Trainer calls in automatic optimisation only" in told
    assert all(
        name in told for name in ("optimizer_step", "optimizer_zero_grad", "lr_scheduler_step", "clipping")
    )


def test_a_backward_hook_that_the_strategy_cannot_honour_is_ignored_with_a_warning() -> None:
    class OwnBackward(SingleDeviceStrategy):
        def backward(self, tensor: torch.Tensor, module: Any = None, *args: Any, **kwargs: Any) -> None:
            tensor.backward()

    class Hooked(Regression):
        def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("not called")

    # As Lightning under DeepSpeed: the override is ignored, with a warning (it was an error here).
    trainer = quiet_trainer(strategy=OwnBackward(device=torch.device("cpu")), max_epochs=1)
    with pytest.warns(
        UserWarning, match=r"overrides backward.*runs the backward pass itself .*so the override is ignored"
    ):
        trainer.fit(Hooked(), _data())
    assert trainer.global_step > 0


def test_evaluation_mode_hooks_and_restored_modes() -> None:
    class MonteCarlo(Regression):
        def __init__(self) -> None:
            super().__init__(dropout=0.5)
            self.frozen = nn.Linear(1, 1).eval()  # kept in eval mode by the user
            self.modes: list[tuple[str, bool]] = []
            self.calls: list[str] = []

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.modes.append(("validation", self.net[1].training))

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.modes.append(("test", self.net[1].training))

        def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            self.modes.append(("predict", self.net[1].training))
            return None

        def on_validation_model_eval(self) -> None:
            self.calls.append("on_validation_model_eval")
            super().on_validation_model_eval()
            self.net[1].train()  # Monte-Carlo dropout while validating

        def on_test_model_eval(self) -> None:
            self.calls.append("on_test_model_eval")
            self.trainer.model.eval()

        def on_test_model_train(self) -> None:
            self.calls.append("on_test_model_train")

        def on_predict_model_eval(self) -> None:
            self.calls.append("on_predict_model_eval")
            self.trainer.model.eval()

    module = MonteCarlo()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    trainer.fit(module, _data(), _data())
    # Not overridden, on_validation_model_train puts each submodule back: the frozen one stays in eval.
    assert module.training and module.net[1].training and not module.frozen.training
    trainer.test(module, _data(8), verbose=False)
    assert not module.training  # on_test_model_train is overridden and left the module in eval mode
    module.train()
    module.frozen.eval()
    trainer.predict(module, _data(8))
    assert module.training and not module.frozen.training
    assert module.modes == [("validation", True), ("test", False), ("predict", False)]
    assert module.calls == [
        "on_validation_model_eval",
        "on_test_model_eval",
        "on_test_model_train",
        "on_predict_model_eval",
    ]


def test_configure_callbacks_adds_and_replaces_trainer_callbacks() -> None:
    class Counting(Callback):
        def __init__(self) -> None:
            self.epochs = 0

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            self.epochs += 1

    mine, stopping = Counting(), EarlyStopping(monitor="train_loss", patience=50)

    class WithCallbacks(Regression):
        def configure_callbacks(self) -> Any:
            return [mine, stopping]

    theirs = EarlyStopping(monitor="val_loss")
    trainer = quiet_trainer(max_epochs=2, callbacks=[theirs])
    trainer.fit(WithCallbacks(), _data())
    assert mine.epochs == 2
    assert trainer.early_stopping_callback is stopping and theirs not in trainer.callbacks
    trainer.validate(WithCallbacks(), _data(8), verbose=False)  # again at every entry point, never twice
    assert trainer.callbacks.count(mine) == 1

    class Wrong(Regression):
        def configure_callbacks(self) -> Any:
            return [object()]

    with pytest.raises(TypeError, match=r"Wrong.configure_callbacks\(\) returned object"):
        quiet_trainer(max_epochs=1).fit(Wrong(), _data())


def test_prepare_data_runs_before_setup_without_a_datamodule() -> None:
    class Preparing(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def prepare_data(self) -> None:
            self.calls.append("prepare_data")

        def setup(self, stage: str) -> None:
            self.calls.append(f"setup:{stage}")

    module = Preparing()
    trainer = _fit(module)
    trainer.test(module, _data(8), verbose=False)
    assert module.calls == ["prepare_data", "setup:fit", "prepare_data", "setup:test"]


def test_batch_transfer_hooks_change_batches_per_loader_before_the_step() -> None:
    class Transferring(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, int, Any]] = []
            self.seen: list[float] = []

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            self.calls.append(("before", dataloader_idx, None))
            x, y = batch
            return x * 0, y  # visible to the step only if the hooks run, and in this order

        def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
            self.calls.append(("transfer", dataloader_idx, device))
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            self.calls.append(("after", dataloader_idx, None))
            x, y = batch
            return x + 1, y

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.seen.append(float(batch[0].mean()))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.seen.append(float(batch[0].mean()))
            return super().training_step(batch, batch_idx)

    module = Transferring()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    trainer.fit(module, _data(), [_data(8), _data(8)])
    cpu = torch.device("cpu")
    per_batch = [("before", None), ("transfer", cpu), ("after", None)]
    expected = [(step, 0, device) for _ in range(2) for step, device in per_batch]  # 2 training batches
    expected += [
        (step, idx, device) for idx in (0, 1) for step, device in per_batch
    ]  # 1 batch per val loader
    assert module.calls == expected
    assert module.seen == [1.0] * 4
