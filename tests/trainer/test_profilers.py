"""``Trainer(profiler=...)``: what each profiler records during a fit, and where its report goes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from drivetrain.profilers import AdvancedProfiler, PassThroughProfiler, PyTorchProfiler, SimpleProfiler
from drivetrain.trainer.callbacks import Callback
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


class EpochEnd(Regression):
    """Overrides a hook, and times a part of its step through ``trainer.profiler``."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        with self.trainer.profiler.profile("my_loss"):
            return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        pass


class BatchEnd(Callback):
    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        pass


def _fit(profiler: Any, root: Path, epochs: int = 2) -> Any:
    trainer = quiet_trainer(
        max_epochs=epochs, profiler=profiler, callbacks=[BatchEnd()], default_root_dir=root
    )
    trainer.fit(EpochEnd(), loader(regression_data(32)), loader(regression_data(16)))  # 4 and 2 batches
    return trainer


def test_simple_profiler_times_steps_hooks_and_data_and_writes_its_report(tmp_path: Path) -> None:
    profiler = SimpleProfiler(dirpath=tmp_path, filename="perf")
    trainer = _fit(profiler, tmp_path)
    assert trainer.profiler is profiler
    calls = {name: len(times) for name, times in profiler.recorded_durations.items()}
    for action in (
        "run_training_batch",
        "[TrainingModule]EpochEnd.training_step",
        "backward",
        "optimizer_step",
        "my_loss",
        "[Callback]BatchEnd.on_train_batch_end",
    ):
        assert calls[action] == 8, action  # 2 epochs of 4 batches
    assert calls["run_training_epoch"] == calls["[TrainingModule]EpochEnd.on_train_epoch_end"] == 2
    assert calls["[TrainingModule]EpochEnd.validation_step"] == 4
    assert calls["train_dataloader_next"] >= 8
    assert all(t >= 0 for times in profiler.recorded_durations.values() for t in times)
    report = (tmp_path / "fit-perf.txt").read_text()
    assert report.startswith("FIT Profiler Report")
    assert "run_training_batch" in report and "Mean duration (s)" in report


def test_the_summary_is_logged_when_no_file_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="drivetrain")
    trainer = _fit("simple", tmp_path, epochs=1)
    assert isinstance(trainer.profiler, SimpleProfiler)
    assert "FIT Profiler Report" in caplog.text and "[TrainingModule]EpochEnd.training_step" in caplog.text
    trainer.validate(trainer.training_module, loader(regression_data(16)), verbose=False)
    assert "VALIDATE Profiler Report" in caplog.text


def test_advanced_profiler_reports_cprofile_statistics_per_action(tmp_path: Path) -> None:
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="adv", line_count_restriction=5)
    _fit(profiler, tmp_path, epochs=1)
    report = (tmp_path / "fit-adv.txt").read_text()
    assert "Profile stats for: [TrainingModule]EpochEnd.training_step" in report
    assert "Profile stats for: backward" in report
    assert "function calls" in report and "cumulative" in report


def test_pytorch_profiler_writes_a_chrome_trace_under_the_log_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="drivetrain")
    trainer = _fit("pytorch", tmp_path, epochs=1)
    assert isinstance(trainer.profiler, PyTorchProfiler)
    trace = Path(trainer.log_dir) / "fit-trace.pt.trace.json"
    assert trainer.profiler.trace_paths == [trace]
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert {"run_training_batch", "[TrainingModule]EpochEnd.training_step", "my_loss"} <= names
    assert "aten::addmm" in names  # the operators inside the ranges
    assert "FIT Profiler Report" in caplog.text and "Self CPU" in caplog.text  # the operator table


def test_advanced_profiler_dumps_raw_statistics_as_lightning_names_them(tmp_path: Path) -> None:
    import pstats

    profiler = AdvancedProfiler(dirpath=tmp_path, filename="adv", dump_stats=True)
    _fit(profiler, tmp_path, epochs=1)
    dumped = sorted(path.name for path in tmp_path.glob("*.prof"))
    assert (
        "fit-adv-backward.prof" in dumped and "fit-adv-[TrainingModule]EpochEnd.training_step.prof" in dumped
    )
    stats = pstats.Stats(str(tmp_path / "fit-adv-backward.prof"))
    assert stats.total_calls > 0  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"dump_stats=True\) writes .prof files into dirpath: pass dirpath="):
        AdvancedProfiler(dump_stats=True)


def test_pytorch_profiler_keeps_its_function_events(tmp_path: Path) -> None:
    profiler = PyTorchProfiler(export_to_chrome=False)
    assert profiler.function_events is None
    _fit(profiler, tmp_path, epochs=1)
    names = {event.name for event in profiler.function_events}
    assert {"run_training_batch", "[TrainingModule]EpochEnd.training_step", "aten::addmm"} <= names
    table = profiler.function_events.key_averages().table(sort_by="cpu_time_total", row_limit=5)
    assert "Self CPU" in table


def test_profiler_names_and_bad_values() -> None:
    assert isinstance(quiet_trainer(profiler="advanced").profiler, AdvancedProfiler)
    assert isinstance(quiet_trainer().profiler, PassThroughProfiler)  # nothing recorded, nothing wrapped
    with pytest.raises(
        ValueError, match=r"profiler='simpel' is not a profiler name.*Did you mean 'simple'\?"
    ):
        quiet_trainer(profiler="simpel")
    with pytest.raises(TypeError, match=r"profiler= expects a name .* got int"):
        quiet_trainer(profiler=3)
    with pytest.raises(TypeError, match=r"PyTorchProfiler got unknown argument\(s\) 'record_shape'"):
        PyTorchProfiler(record_shape=True)


def test_without_a_profiler_the_steps_are_not_wrapped() -> None:
    trainer = quiet_trainer(max_epochs=1)
    model = EpochEnd()
    trainer.fit(model, loader(regression_data(8)))
    # The per-step path calls the module's own functions: no timing wrapper in between.
    assert trainer.run_state.optimization.training_step == model.training_step
    assert trainer.run_state.hooks.on_train_epoch_end == model.on_train_epoch_end
