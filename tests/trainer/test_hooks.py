"""Hooks: called in the documented order, and only where a module or callback overrides them."""

from __future__ import annotations

from typing import Any

from drivetrain.trainer import Callback, TrainingModule
from drivetrain.trainer.hooks import HOOKS, HookRunner
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

_CALLBACK_HOOKS = [name for name, (in_callbacks, _) in HOOKS.items() if in_callbacks]
_MODULE_HOOKS = [name for name, (_, in_module) in HOOKS.items() if in_module]


def _recording_callback(calls: list[tuple[str, str]]) -> Callback:
    namespace = {
        name: (lambda n: lambda self, *args: calls.append(("callback", n)))(name) for name in _CALLBACK_HOOKS
    }
    return type("Recorder", (Callback,), namespace)()


def _recording_module(calls: list[tuple[str, str]]) -> TrainingModule:
    namespace = {
        name: (lambda n: lambda self, *args: calls.append(("module", n)))(name) for name in _MODULE_HOOKS
    }
    return type("RecordingRegression", (Regression,), namespace)()


def test_fit_calls_hooks_in_order() -> None:
    calls: list[tuple[str, str]] = []
    trainer = quiet_trainer(
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        num_sanity_val_steps=1,
        callbacks=[_recording_callback(calls)],
    )
    trainer.fit(_recording_module(calls), loader(), loader())

    def both(name: str) -> list[tuple[str, str]]:  # callbacks first, the *_end hooks too (Lightning 2.6)
        return [("callback", name), ("module", name)]

    validation = [
        *both("on_validation_start"),
        *both("on_validation_epoch_start"),
        *both("on_validation_batch_start"),
        *both("on_validation_batch_end"),
        *both("on_validation_epoch_end"),
        *both("on_validation_end"),
    ]
    batch = [
        *both("on_train_batch_start"),
        *both("on_before_zero_grad"),  # Lightning's place: after training_step, before the backward
        *both("on_before_backward"),
        *both("on_after_backward"),
        *both("on_before_optimizer_step"),
        *both("on_train_batch_end"),
    ]
    expected = [
        *both("setup"),
        *both("on_fit_start"),
        ("callback", "on_sanity_check_start"),
        *validation,
        ("callback", "on_sanity_check_end"),
        *both("on_train_start"),
        *both("on_train_epoch_start"),
        *batch,
        *batch,
        *validation,
        *both("on_train_epoch_end"),
        *both("on_train_end"),
        *both("on_fit_end"),
        *both("teardown"),
    ]
    assert calls == expected


def test_test_and_predict_hooks() -> None:
    calls: list[tuple[str, str]] = []
    trainer = quiet_trainer(
        limit_test_batches=1, limit_predict_batches=1, callbacks=[_recording_callback(calls)]
    )
    module = _recording_module(calls)
    trainer.test(module, loader(), verbose=False)
    names = [name for who, name in calls if who == "module"]
    assert names == [
        "setup",
        "on_test_start",
        "on_test_epoch_start",
        "on_test_batch_start",
        "on_test_batch_end",
        "on_test_epoch_end",
        "on_test_end",
        "teardown",
    ]
    calls.clear()
    trainer.predict(module, loader(regression_data(8)))
    names = [name for who, name in calls if who == "callback"]
    assert names == [
        "setup",
        "on_predict_start",
        "on_predict_epoch_start",
        "on_predict_batch_start",
        "on_predict_batch_end",
        "on_predict_epoch_end",
        "on_predict_end",
        "teardown",
    ]


def test_only_overridden_hooks_are_dispatched() -> None:
    class OnlyBatchEnd(Callback):
        def on_train_batch_end(self, *args: Any) -> None: ...

    trainer = quiet_trainer()
    runner = HookRunner(trainer, Regression(), [OnlyBatchEnd(), Callback()], TrainingModule, Callback)
    assert runner.on_train_batch_end is not None
    dispatched = [name for name in HOOKS if getattr(runner, name) is not None]
    assert dispatched == ["on_train_batch_end"]


def test_exception_hook_sees_the_error() -> None:
    seen: list[BaseException] = []

    class Watch(Callback):
        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            seen.append(exception)

    class Fails(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise KeyError("broken step")

    trainer = quiet_trainer(callbacks=[Watch()])
    try:
        trainer.fit(Fails(), loader())
    except KeyError:
        pass
    assert [type(e) for e in seen] == [KeyError]
    assert trainer.interrupted
