"""Built-in callbacks from Lightning's toolbox: Timer, LambdaCallback, GradientAccumulationScheduler,
DeviceStatsMonitor, SpikeDetection and BasePredictionWriter (one process; see also
``test_prediction_writer_ddp.py``). Each test asserts the callback's effect on the run."""

from __future__ import annotations

import csv
import datetime
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain._utilities.imports import package_available
from drivetrain.accelerators import CPUAccelerator
from drivetrain.loggers import CSVLogger
from drivetrain.trainer import RunningStage
from drivetrain.trainer.callbacks import (
    BasePredictionWriter,
    DeviceStatsMonitor,
    GradientAccumulationScheduler,
    LambdaCallback,
    SpikeDetection,
    Timer,
    TrainingSpikeException,
)
from drivetrain.trainer.callbacks import timer as timer_module
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data, weights

# -- Timer -----------------------------------------------------------------------------------------


class FakeClock:
    """``time.monotonic`` for the Timer: advanced by the module, one second per training step."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Ticking(Regression):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.clock.now += 1.0
        return super().training_step(batch, batch_idx)


def test_timer_stops_within_one_batch_and_resumes_with_the_time_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timer_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    saved = tmp_path / "step3.ckpt"

    def save_at_step_3(trainer: dt.Trainer, module: Any, *args: Any) -> None:
        if trainer.global_step == 3:
            trainer.save_checkpoint(saved)

    timer = Timer(duration=datetime.timedelta(seconds=5.5))
    trainer = quiet_trainer(
        max_epochs=3, callbacks=[timer, LambdaCallback(on_train_batch_end=save_at_step_3)]
    )
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        trainer.fit(Ticking(clock), loader())  # 8 batches per epoch: the limit falls inside epoch 0
    assert trainer.global_step == 6  # 6 s of training >= 5.5 s: stopped after that batch
    assert timer.time_elapsed("train") == 6.0 and timer.time_remaining() == -0.5
    assert any("Time limit reached" in r.getMessage() for r in caplog.records)

    resumed_timer = Timer(duration={"seconds": 5.5})
    resumed = quiet_trainer(max_epochs=3, callbacks=[resumed_timer])
    resumed.fit(Ticking(clock), loader(), ckpt_path=saved)
    assert resumed.global_step == 6  # 3 s were spent before the checkpoint; 3 more reach the limit
    assert resumed_timer.time_elapsed() == 6.0

    out_of_time = Timer(duration="00:00:00:02")
    late = quiet_trainer(max_epochs=3, callbacks=[out_of_time])
    late.fit(Ticking(clock), loader(), ckpt_path=saved)  # 3 s already spent: no batch at all
    assert late.global_step == 3


def test_timer_epoch_interval_and_time_per_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timer_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    timer = Timer(duration={"seconds": 3}, interval="epoch", verbose=False)
    trainer = quiet_trainer(max_epochs=5, callbacks=[timer])
    trainer.fit(Ticking(clock), loader(), loader(regression_data(16)))
    assert trainer.global_step == 8  # checked at epoch ends only: the whole first epoch runs
    assert timer.start_time("train") is not None and timer.end_time("train") is not None
    assert timer.time_elapsed("validate") == 0.0  # validation steps do not move the fake clock
    assert timer.start_time(RunningStage.VALIDATING) is not None
    assert timer.start_time("test") is None and timer.time_elapsed("test") == 0.0
    trainer.test(Ticking(clock), loader(regression_data(16)), verbose=False)
    assert timer.end_time("test") is not None


def test_timer_without_a_limit_measures_real_stages() -> None:
    timer = Timer()
    trainer = quiet_trainer(max_epochs=1, callbacks=[timer])
    trainer.fit(Regression(), loader(), loader(regression_data(16)))
    assert timer.time_remaining() is None
    assert timer.time_elapsed("train") > 0 and timer.time_elapsed("validate") > 0
    assert timer.end_time("train") >= timer.start_time("train")  # type: ignore[operator]
    assert trainer.global_step == 8


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_a_zero_duration_stops_before_the_first_batch_as_in_lightning(interval: str) -> None:
    trainer = quiet_trainer(
        max_epochs=3, callbacks=[Timer(duration=datetime.timedelta(0), interval=interval)]
    )
    trainer.fit(Regression(), loader())
    assert (trainer.global_step, trainer.current_epoch) == (0, 0)
    held = quiet_trainer(min_epochs=2, callbacks=[Timer(duration="00:00:00:00")])  # min_epochs still hold
    held.fit(Regression(), loader())
    assert held.current_epoch == 2


def test_timer_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match=r"Timer\(duration\)='1 hour'; write it as 'DD:HH:MM:SS'"):
        Timer(duration="1 hour")
    with pytest.raises(ValueError, match="use 'step' or 'epoch'"):
        Timer(interval="batch")
    with pytest.raises(ValueError, match=r"is negative; use a duration >= 0"):
        Timer(duration=datetime.timedelta(seconds=-1))
    with pytest.raises(ValueError, match="Unknown stage 'training'; use one of train, sanity_check"):
        Timer().time_elapsed("training")


# -- LambdaCallback --------------------------------------------------------------------------------


def test_lambda_callback_runs_the_given_hooks() -> None:
    seen: list[tuple[str, Any]] = []
    first = LambdaCallback(
        on_train_epoch_end=lambda trainer, module: seen.append(("epoch_end", trainer.current_epoch)),
        on_train_batch_end=lambda trainer, module, outputs, batch, batch_idx: seen.append(
            ("batch", batch_idx)
        ),
        on_before_backward=None,  # Lightning's way to leave a hook out
    )
    second = LambdaCallback(setup=lambda trainer, module, stage: seen.append(("setup", stage)))
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=2, callbacks=[first, second])
    trainer.fit(Regression(), loader())
    assert seen == [
        ("setup", "fit"),
        ("batch", 0),
        ("batch", 1),
        ("epoch_end", 0),
        ("batch", 0),
        ("batch", 1),
        ("epoch_end", 1),
    ]
    assert "on_train_batch_end" in repr(first)


def test_lambda_callback_rejects_unknown_hooks_and_values() -> None:
    with pytest.raises(
        ValueError, match=r"on_train_epoch_ends, which is not a hook\. Use the names of Callback hooks"
    ):
        LambdaCallback(on_train_epoch_ends=print)
    with pytest.raises(TypeError, match="give a function"):
        LambdaCallback(on_fit_start=3)  # type: ignore[arg-type]


# -- GradientAccumulationScheduler --------------------------------------------------------------


def test_accumulation_schedule_changes_the_optimizer_steps_per_epoch() -> None:
    steps_per_epoch: list[int] = []
    factors: list[int] = []
    before = [0]

    def count(trainer: dt.Trainer, module: Any) -> None:
        steps_per_epoch.append(trainer.global_step - before[0])
        before[0] = trainer.global_step
        factors.append(trainer.accumulate_grad_batches)

    scheduler = GradientAccumulationScheduler(scheduling={1: 2, 2: 4})
    trainer = quiet_trainer(max_epochs=4, callbacks=[scheduler, LambdaCallback(on_train_epoch_end=count)])
    trainer.fit(Regression(), loader())  # 8 batches per epoch
    assert steps_per_epoch == [8, 4, 2, 2]
    assert factors == [1, 2, 4, 4]
    assert trainer.accumulate_grad_batches == 1  # the Trainer's own setting again after the fit
    assert scheduler.scheduling == {0: 1, 1: 2, 2: 4} and scheduler.get_accumulate_grad_batches(7) == 4


def test_scheduled_accumulation_equals_the_same_fixed_accumulation() -> None:
    torch.manual_seed(0)
    scheduled_model = Regression()
    torch.manual_seed(0)
    fixed_model = Regression()
    quiet_trainer(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 4})]).fit(
        scheduled_model, loader()
    )
    quiet_trainer(max_epochs=1, accumulate_grad_batches=4).fit(fixed_model, loader())
    assert all(
        torch.equal(a, b) for a, b in zip(weights(scheduled_model).values(), weights(fixed_model).values())
    )


class Manual(Regression):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        optimizer.step()


def test_accumulation_scheduler_refuses_what_it_cannot_honour() -> None:
    with pytest.raises(ValueError, match="epoch -1 in scheduling is not an int >= 0"):
        GradientAccumulationScheduler({-1: 2})
    with pytest.raises(ValueError, match="the factor 0 for epoch 1 is not an int >= 1"):
        GradientAccumulationScheduler({1: 0})
    with pytest.raises(ValueError, match="non-empty dict"):
        GradientAccumulationScheduler({})
    both = quiet_trainer(
        max_epochs=1, accumulate_grad_batches=2, callbacks=[GradientAccumulationScheduler({1: 4})]
    )
    with pytest.raises(
        ValueError, match=r"Trainer\(accumulate_grad_batches=2\) and a GradientAccumulationScheduler"
    ):
        both.fit(Regression(), loader())
    manual = quiet_trainer(max_epochs=1, callbacks=[GradientAccumulationScheduler({0: 2})])
    with pytest.raises(ValueError, match="needs automatic optimisation"):
        manual.fit(Manual(), loader())
    trainer = quiet_trainer(max_epochs=1)
    with pytest.raises(ValueError, match=r"trainer\.accumulate_grad_batches must be an int >= 1"):
        trainer.accumulate_grad_batches = 0


@pytest.mark.deepspeed
@pytest.mark.timeout(240)
@pytest.mark.skipif(not package_available("deepspeed"), reason="needs the deepspeed extra")
def test_accumulation_scheduler_is_an_error_under_deepspeed() -> None:
    trainer = quiet_trainer(strategy="deepspeed", max_epochs=1)
    # The check runs in the callback's setup hook, before the model is set up. A whole DeepSpeed fit on
    # this CPU machine does not start within minutes, so the hook is called as the Trainer calls it.
    with pytest.raises(
        ValueError, match="GradientAccumulationScheduler cannot be used with DeepSpeedStrategy"
    ):
        GradientAccumulationScheduler({1: 2}).setup(trainer, Regression(), "fit")


# -- DeviceStatsMonitor -------------------------------------------------------------------------


class StatsAccelerator(CPUAccelerator):
    """A user's hardware plugin with its own figures (the seed's get_device_stats contract)."""

    def get_device_stats(self, device: Any = "cpu") -> dict[str, Any]:
        return {"memory_allocated": 123.0, "name": "not a number", "busy": True}


def _rows(logger: CSVLogger) -> list[dict[str, str]]:
    logger.save()
    with open(logger.metrics_file_path, newline="") as file:
        return list(csv.DictReader(file))


def test_device_stats_monitor_logs_the_accelerators_figures(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    trainer = quiet_trainer(
        accelerator=StatsAccelerator(),
        max_epochs=1,
        limit_train_batches=4,
        log_every_n_steps=2,
        logger=logger,
        callbacks=[DeviceStatsMonitor(cpu_stats=True)],
    )
    trainer.fit(Regression(), loader(), loader(regression_data(16)))
    trainer.test(Regression(), loader(regression_data(16)), verbose=False)
    rows = _rows(logger)
    keys = {
        key for row in rows for key, value in row.items() if value and key.startswith("DeviceStatsMonitor")
    }
    for hook in (
        "on_train_batch_start",
        "on_train_batch_end",
        "on_validation_batch_start",
        "on_test_batch_end",
    ):
        assert f"DeviceStatsMonitor.{hook}/memory_allocated" in keys
    assert not any(key.endswith(("/name", "/busy")) for key in keys)  # numbers only
    assert not any("/cpu_" in key for key in keys)  # the device is the CPU: its stats are already there
    train_steps = [r["step"] for r in rows if r.get("DeviceStatsMonitor.on_train_batch_end/memory_allocated")]
    assert train_steps == ["2", "4"]  # every log_every_n_steps batches


def test_device_stats_monitor_cpu_stats_and_loggers(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    trainer = quiet_trainer(max_steps=2, log_every_n_steps=1, logger=logger, callbacks=[DeviceStatsMonitor()])
    trainer.fit(Regression(), loader())
    rows = _rows(logger)
    assert [
        float(r["DeviceStatsMonitor.on_train_batch_end/cpu_rss_bytes"]) > 0
        for r in rows
        if r.get("DeviceStatsMonitor.on_train_batch_end/cpu_rss_bytes")
    ] == [True, True]

    silent = CSVLogger(tmp_path / "off", flush_logs_every_n_steps=1)
    quiet_trainer(
        max_steps=2, log_every_n_steps=1, logger=silent, callbacks=[DeviceStatsMonitor(cpu_stats=False)]
    ).fit(Regression(), loader())
    assert not any(
        key.startswith("DeviceStatsMonitor") for row in _rows(silent) for key, v in row.items() if v
    )
    with pytest.raises(
        ValueError, match="DeviceStatsMonitor logs through the Trainer's loggers, but the Trainer has none"
    ):
        quiet_trainer(max_steps=1, callbacks=[DeviceStatsMonitor()]).fit(Regression(), loader())
    with pytest.raises(ValueError, match="use True, False or None"):
        DeviceStatsMonitor(cpu_stats="yes")  # type: ignore[arg-type]


# -- SpikeDetection (rtol=3: the first batches' losses of this regression differ by up to 3x) -----


class Spiky(Regression):
    """A regression whose loss reads 100 times its value on chosen global batches (the gradients stay
    the same, so a step that is not skipped trains as usual)."""

    def __init__(self, spikes: set[int]) -> None:
        super().__init__(lr=0.01)
        self.spikes = spikes

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        position = self.trainer.fit_progress.total_batches_done
        return loss + 99 * loss.detach() if position in self.spikes else loss


def test_spike_detection_raises_before_the_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Spiky({5})
    recorded: list[dict[str, torch.Tensor]] = []
    keep = LambdaCallback(on_train_batch_end=lambda trainer, module, *args: recorded.append(weights(module)))
    trainer = quiet_trainer(
        max_epochs=1, callbacks=[SpikeDetection(rtol=3.0, exclude_batches_path=tmp_path), keep]
    )
    with pytest.raises(TrainingSpikeException, match="Training spike detected in batch 5 of epoch 0"):
        trainer.fit(model, loader())
    assert trainer.global_step == 5  # batch 5 raised before its optimizer step
    assert all(torch.equal(a, b) for a, b in zip(recorded[-1].values(), weights(model).values()))
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [5]


def test_spike_detection_warns_and_goes_on(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    torch.manual_seed(0)
    detector = SpikeDetection(action="warn", window=4, rtol=3.0, exclude_batches_path=tmp_path)
    trainer = quiet_trainer(max_epochs=2, callbacks=[detector])
    with caplog.at_level(logging.WARNING, logger="drivetrain"):
        trainer.fit(Spiky({3, 12}), loader())
    assert trainer.global_step == 16
    assert [(s["epoch"], s["batch_idx"]) for s in detector.spikes] == [(0, 3), (1, 4)]
    assert sum("Loss spike in batch" in r.getMessage() for r in caplog.records) == 2


def test_spike_detection_skips_the_spiking_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    spiky = Spiky({2})
    torch.manual_seed(0)
    clean = Spiky(set())
    skipped = quiet_trainer(
        max_steps=3, callbacks=[SpikeDetection(action="skip", rtol=3.0, exclude_batches_path=tmp_path)]
    )
    skipped.fit(spiky, loader())
    # The same run without the spike, whose third step is skipped by hand: the same weights.
    reference = quiet_trainer(max_steps=2)
    reference.fit(clean, loader(regression_data(64)))
    assert skipped.global_step == 3  # the skipped step still counts, as a skipped fp16 step does
    assert all(torch.equal(a, b) for a, b in zip(weights(spiky).values(), weights(clean).values()))


def test_spike_detection_tolerances_and_errors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    # A rise must exceed 1e9 to count.
    lenient = SpikeDetection(action="warn", atol=1e9, exclude_batches_path=tmp_path)
    quiet_trainer(max_epochs=1, callbacks=[lenient]).fit(Spiky({3}), loader())
    assert lenient.spikes == []
    torch.manual_seed(0)
    # Any rise counts after 2 batches.
    relative = SpikeDetection(action="warn", rtol=None, atol=None, warmup=2, exclude_batches_path=tmp_path)
    quiet_trainer(max_epochs=1, callbacks=[relative]).fit(Spiky({3}), loader())
    assert 3 in [spike["batch_idx"] for spike in relative.spikes]
    with pytest.raises(ValueError, match="use one of raise, warn, skip"):
        SpikeDetection(action="stop")
    with pytest.raises(ValueError, match=r"SpikeDetection\(window=0\); use an int >= 1"):
        SpikeDetection(window=0)
    with pytest.raises(ValueError, match=r"SpikeDetection\(mode='up'\)"):
        SpikeDetection(mode="up")


# -- BasePredictionWriter -----------------------------------------------------------------------


class Collecting(BasePredictionWriter):
    def __init__(self, interval: str) -> None:
        super().__init__(interval)
        self.batches: list[tuple[list[int] | None, torch.Tensor, int]] = []
        self.epoch: tuple[Any, Any] | None = None

    def write_on_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        self.batches.append((batch_indices, prediction, dataloader_idx))

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        self.epoch = (predictions, batch_indices)


def test_prediction_writer_gets_each_batchs_dataset_indices() -> None:
    data = TensorDataset(torch.arange(20.0).unsqueeze(1).repeat(1, 4), torch.zeros(20, 1))
    shuffled = DataLoader(data, batch_size=6, shuffle=True, num_workers=2)
    writer = Collecting("batch_and_epoch")
    model = Regression()
    quiet_trainer(callbacks=[writer]).predict(model, shuffled, return_predictions=False)
    assert sorted(i for indices, _, _ in writer.batches for i in indices) == list(range(20))
    for indices, prediction, _ in writer.batches:  # the indices name the items that were predicted
        expected = model(data.tensors[0][indices]).detach()
        torch.testing.assert_close(prediction, expected)
    assert writer.epoch is not None
    predictions, indices = writer.epoch  # kept for the epoch write although return_predictions=False
    assert len(predictions) == len(indices) == 4 and indices == [b for b, _, _ in writer.batches]


def test_prediction_writer_intervals_and_errors() -> None:
    batch_only = Collecting("batch")
    trainer = quiet_trainer(callbacks=[batch_only], limit_predict_batches=3)
    result = trainer.predict(Regression(), [loader(batch_size=8), loader(batch_size=16)])
    assert batch_only.epoch is None and [d for _, _, d in batch_only.batches] == [0, 0, 0, 1, 1, 1]
    assert batch_only.batches[3][0] == list(range(16))
    assert len(result) == 2 and trainer.predict_loop is not None
    assert [len(p) for p in trainer.predict_loop.predictions] == [3, 3]

    class EpochOnly(BasePredictionWriter):
        def write_on_epoch_end(
            self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any
        ) -> None:
            pass

    with pytest.raises(
        NotImplementedError, match=r"EpochOnly\(write_interval='batch'\) writes with write_on_batch_end"
    ):
        quiet_trainer(callbacks=[EpochOnly()]).predict(Regression(), loader())
    with pytest.raises(ValueError, match="use 'batch', 'epoch' or 'batch_and_epoch'"):
        EpochOnly("step")
