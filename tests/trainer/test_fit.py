"""Trainer.fit in one process: the loop matches a hand-written one, stops when told, validates when due."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.loggers.logger import DummyLogger
from drivetrain.trainer import Callback
from trainer.trainer_models import (
    Regression,
    assert_same_weights,
    loader,
    quiet_trainer,
    regression_data,
    weights,
)


def hand_written(
    model: nn.Module,
    batches: list[Any],
    epochs: int,
    lr: float,
    accumulate: int = 1,
    clip: tuple[str, float] | None = None,
) -> dict[str, torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for index, (x, y) in enumerate(batches):
            loss = nn.functional.mse_loss(model(x), y) / accumulate
            loss.backward()
            if (index + 1) % accumulate == 0 or index + 1 == len(batches):
                if clip is not None and clip[0] == "norm":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip[1])
                elif clip is not None:
                    torch.nn.utils.clip_grad_value_(model.parameters(), clip[1])
                optimizer.step()
                optimizer.zero_grad()
    return weights(model)


@pytest.mark.parametrize(
    ("accumulate", "clip"),
    [(1, None), (3, None), (3, ("norm", 0.5)), (2, ("value", 0.05)), (1, ("norm", 0.1))],
)
def test_fit_matches_a_hand_written_loop_exactly(accumulate: int, clip: tuple[str, float] | None) -> None:
    torch.manual_seed(0)
    model = Regression(lr=0.1)
    reference = Regression(lr=0.1)
    reference.load_state_dict(model.state_dict())
    data = loader(regression_data(40), batch_size=4)  # 10 batches: the last accumulation window is partial
    batches = list(data)
    expected = hand_written(reference, batches, epochs=2, lr=0.1, accumulate=accumulate, clip=clip)
    trainer = quiet_trainer(
        max_epochs=2,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=clip[1] if clip else None,
        gradient_clip_algorithm=clip[0] if clip else None,
    )
    trainer.fit(model, data)
    assert_same_weights(weights(model), expected)
    assert trainer.global_step == 2 * math.ceil(10 / accumulate)
    assert trainer.current_epoch == 2
    assert trainer.state.finished and trainer.state.fn.value == "fit"


def test_any_iterable_of_batches_trains_and_max_steps_stops_mid_epoch() -> None:
    model = Regression()
    trainer = quiet_trainer(max_steps=5)
    trainer.fit(model, list(loader()))
    assert trainer.global_step == 5
    assert trainer.current_epoch == 0 or trainer.current_epoch == 1  # the epoch ended early
    assert trainer.callback_metrics["train_loss"].dim() == 0


def test_limit_and_validation_schedule() -> None:
    seen: list[tuple[int, int]] = []

    class Recorder(Callback):
        def on_validation_start(self, trainer: dt.Trainer, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                seen.append((trainer.current_epoch, trainer.fit_progress.batches_done))

    trainer = quiet_trainer(
        max_epochs=4,
        limit_train_batches=6,
        val_check_interval=0.5,
        check_val_every_n_epoch=2,
        callbacks=[Recorder()],
    )
    trainer.fit(Regression(), loader(), loader())
    assert seen == [(1, 3), (1, 6), (3, 3), (3, 6)]
    assert trainer.global_step == 24


def test_int_val_check_interval_counts_across_epochs() -> None:
    seen: list[int] = []

    class Recorder(Callback):
        def on_validation_start(self, trainer: dt.Trainer, pl_module: Any) -> None:
            seen.append(trainer.global_step)

    trainer = quiet_trainer(
        max_epochs=3,
        limit_train_batches=4,
        val_check_interval=5,
        check_val_every_n_epoch=None,
        callbacks=[Recorder()],
    )
    trainer.fit(Regression(), loader(), loader())
    assert seen == [5, 10]


def test_sanity_check_runs_first_and_is_not_recorded() -> None:
    stages: list[str] = []

    class Recorder(Callback):
        def on_validation_batch_end(self, trainer: dt.Trainer, *args: Any) -> None:
            stages.append("sanity" if trainer.sanity_checking else "val")

    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=2, callbacks=[Recorder()])
    trainer.fit(Regression(), loader(), loader())
    assert stages == ["sanity"] * 2 + ["val"] * 8
    assert "val_loss" in trainer.callback_metrics


def test_should_stop_respects_min_epochs() -> None:
    class StopAtOnce(Callback):
        def on_train_batch_end(self, trainer: dt.Trainer, *args: Any) -> None:
            trainer.should_stop = True

    trainer = quiet_trainer(max_epochs=10, min_epochs=3, callbacks=[StopAtOnce()])
    trainer.fit(Regression(), loader())
    assert trainer.current_epoch == 3
    assert trainer.global_step == 3 * 8  # three whole epochs, then the request to stop is honoured


def test_on_train_batch_start_returning_minus_one_ends_the_epoch() -> None:
    class Skipper(Regression):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
            return -1 if batch_idx == 3 else None

    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(Skipper(), loader())
    assert trainer.global_step == 6


def test_max_time_stops(tmp_path: Path) -> None:
    class Slow(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            import time

            time.sleep(0.02)
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_time={"seconds": 0.2}, max_epochs=-1)
    trainer.fit(Slow(), loader())
    assert 3 <= trainer.global_step <= 40


def test_fast_dev_run_runs_one_batch_of_each_stage_without_logs_or_checkpoints(tmp_path: Path) -> None:
    trainer = dt.Trainer(
        accelerator="cpu",
        fast_dev_run=True,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
    )

    class UsesItsLogger(Regression):
        def on_train_epoch_end(self) -> None:  # module code written for a real logger runs unchanged
            self.logger.experiment.add_scalar("custom", 1.0, self.global_step)
            self.loggers[0].log_metrics({"custom": 1.0})

    trainer.fit(UsesItsLogger(), loader(), loader())
    assert trainer.global_step == 1
    # As in Lightning: a DummyLogger stands in for the configured loggers, and records nothing.
    assert isinstance(trainer.logger, DummyLogger) and trainer.loggers == [trainer.logger]
    assert not list(tmp_path.iterdir())
    assert trainer.test(Regression(), loader(), verbose=False)[0]["test_count"] == 8.0
    assert dt.Trainer(fast_dev_run=True, logger=False, enable_progress_bar=False).loggers == []


def test_training_step_returning_none_skips_the_update() -> None:
    class Skips(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            return None if batch_idx % 2 else {"loss": loss}

    model = Skips()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model, loader())
    assert trainer.global_step == 4


def test_datamodule_hooks_and_loaders() -> None:
    calls: list[str] = []

    class Data(dt.DataModule):
        def __init__(self, batch_size: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()

        def prepare_data(self) -> None:
            calls.append("prepare")

        def setup(self, stage: str) -> None:
            calls.append(f"setup:{stage}")
            self.data = regression_data()

        def train_dataloader(self) -> Any:
            return loader(self.data, self.hparams.batch_size)

        def val_dataloader(self) -> Any:
            return loader(self.data, 16)

        def teardown(self, stage: str) -> None:
            calls.append(f"teardown:{stage}")

    data = Data()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Regression(), datamodule=data)
    assert calls == ["prepare", "setup:fit", "teardown:fit"]
    assert trainer.datamodule is data and trainer.global_step == 8
    assert trainer.validate(datamodule=data, verbose=False)[0]["val_loss"] > 0


def test_modules_own_dataloader_methods_are_used() -> None:
    class SelfFed(Regression):
        def train_dataloader(self) -> Any:
            return loader()

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(SelfFed())
    assert trainer.global_step == 8


def test_precision_64_true_trains_in_double() -> None:
    model = Regression()
    trainer = quiet_trainer(max_epochs=1, precision="64-true")
    trainer.fit(model, loader())
    assert next(model.parameters()).dtype == torch.float64
    assert trainer.precision == "64-true"


def test_deterministic_applies_for_the_run_only() -> None:
    seen: list[bool] = []

    class Check(Regression):
        def on_train_start(self) -> None:
            seen.append(torch.are_deterministic_algorithms_enabled())

    before = torch.are_deterministic_algorithms_enabled()
    quiet_trainer(max_steps=1, deterministic=True).fit(Check(), loader())
    assert seen == [True] and torch.are_deterministic_algorithms_enabled() == before


class _ComplexFilter(Regression):
    """A regressor whose prediction goes through a fixed complex filter (a buffer) and a complex gain (a parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("filter", torch.tensor([0.5 + 1.5j]))
        self.gain = nn.Parameter(torch.tensor([1.0 - 0.5j]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Both imaginary parts matter: (a + bi)(c + di) has real part ac - bd.
        return (self.net(x) * self.filter * self.gain).real.float()


@pytest.mark.parametrize("precision", ["64-true", "16-true", "bf16-true"])
def test_true_precisions_keep_complex_buffers_and_parameters(precision: str) -> None:
    torch.manual_seed(0)
    model = _ComplexFilter()
    quiet_trainer(max_epochs=1, precision=precision).fit(model, loader())
    expected_dtype = {"64-true": torch.float64, "16-true": torch.float16, "bf16-true": torch.bfloat16}
    assert model.net[0].weight.dtype == expected_dtype[precision]
    assert model.filter.dtype == torch.complex64
    assert torch.equal(model.filter, torch.tensor([0.5 + 1.5j]))
    assert model.gain.dtype == torch.complex64
    assert model.gain.imag.item() != 0.0  # trained as a complex number, not cast to its real part
    assert model.gain.grad is None or model.gain.grad.dtype == torch.complex64


EVERY_BATCH = [(epoch, step) for epoch in range(3) for step in range(4 * epoch + 1, 4 * epoch + 5)]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        # A microsecond passes during every batch: each one is due (no sleeping, no clock in the assert).
        ({"val_check_interval": datetime.timedelta(microseconds=1)}, EVERY_BATCH),
        (
            {"val_check_interval": datetime.timedelta(microseconds=1), "check_val_every_n_epoch": None},
            EVERY_BATCH,
        ),
        (
            {"val_check_interval": datetime.timedelta(microseconds=1), "check_val_every_n_epoch": 2},
            [(1, 5), (1, 6), (1, 7), (1, 8)],
        ),
        ({"val_check_interval": {"days": 1}}, []),  # never due: not even at an epoch's end
        ({"val_check_interval": "01:00:00:00"}, []),
    ],
)
def test_a_time_based_val_check_interval_validates_when_the_time_has_passed(
    settings: dict[str, Any], expected: list[tuple[int, int]]
) -> None:
    """Lightning 2.6's time-based val_check_interval ('DD:HH:MM:SS', timedelta or dict): validation after the
    batch at which that much time has passed since the last one; the (epoch, step) lists are Lightning's."""

    class Validated(Regression):
        seen: list[tuple[int, int]]

        def on_validation_end(self) -> None:
            self.seen.append((self.current_epoch, self.global_step))

    module = Validated()
    module.seen = []
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=4, **settings)
    trainer.fit(module, loader(), loader())
    assert module.seen == expected
    assert isinstance(trainer.val_check_interval, datetime.timedelta)
