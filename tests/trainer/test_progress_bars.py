"""The progress bars as users see them: a real terminal (tmux), a redirected log file, a rich console.

A log file gets whole lines (no carriage-return redraws) from global rank 0 only; a terminal
gets one bar per stage with the metrics, it/s and the time left.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import drivetrain as dt
from drivetrain.trainer.callbacks import ModelSummary, TQDMProgressBar
from helpers.scripts import clean_env
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

PROGRAM = str(Path(__file__).parent / "scripts" / "progress_program.py")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run_to_file(kind: str, devices: int, path: Path) -> str:
    env = clean_env()
    for name in (
        "FORCE_COLOR",
        "TTY_COMPATIBLE",
        "TTY_INTERACTIVE",
    ):  # rich would take the file for a terminal
        env.pop(name, None)
    with open(path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, PROGRAM, kind, str(devices)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            raise AssertionError(f"{kind} program did not finish; output:\n{path.read_text()}") from None
    output = path.read_text()
    assert code == 0, output
    return output


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["tqdm", "rich"])
def test_a_redirected_log_gets_plain_lines_from_rank_zero_only(kind: str, tmp_path: Path) -> None:
    if kind == "rich":
        pytest.importorskip("rich")
    output = _run_to_file(kind, 2, tmp_path / "train.log")
    assert "\r" not in output  # no redraws: a log file keeps every one of them
    lines = output.splitlines()
    # 2 processes share 64 samples in batches of 8: 4 training batches per process and epoch.
    for epoch in (0, 1):
        (line,) = [line for line in lines if line.startswith(f"Epoch {epoch}: ")]
        assert "100% 4/4" in line and "it/s]" in line
        assert "train_loss=" in line
    assert "val_loss=" in next(line for line in lines if line.startswith("Epoch 1: "))
    assert sum(line.startswith("Validation: 100% 2/2") for line in lines) == 2  # once per epoch, rank 0 only
    assert sum(line.startswith("Sanity checking: 100% 2/2") for line in lines) == 1
    assert sum(line.startswith("Testing: 100% 2/2") for line in lines) == 1
    assert lines.count("message from training_step") == 1
    assert lines.count("program finished") == 1


def test_plain_lines_come_at_most_every_log_interval(capfd: pytest.CaptureFixture[str]) -> None:
    # log_interval=0: a line after every batch (a log wants fewer; this shows the interval is honoured).
    trainer = quiet_trainer(
        max_epochs=1, enable_progress_bar=True, callbacks=[TQDMProgressBar(log_interval=0)]
    )
    trainer.fit(Regression(), loader())
    err = capfd.readouterr().err
    epoch_lines = [line for line in err.splitlines() if line.startswith("Epoch 0: ")]
    assert [line.split("]")[0].split(" ")[3] for line in epoch_lines] == [f"{n}/8" for n in range(1, 9)] + [
        "8/8"
    ]
    with pytest.raises(ValueError, match="use a number of seconds >= 0"):
        TQDMProgressBar(log_interval=-1)


def test_lightnings_bar_attributes(capfd: pytest.CaptureFixture[str]) -> None:
    # Lightning's TQDMProgressBar: the totals it counts to, and the bars it drew (kept after they close).
    bar = TQDMProgressBar()
    with pytest.raises(TypeError, match=r"TQDMProgressBar.train_progress_bar does not exist yet"):
        _ = bar.train_progress_bar
    seen: list[tuple[int, int | float, int | float]] = []

    class Totals(dt.trainer.Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            seen.append((trainer.current_epoch, bar.total_train_batches, bar.total_val_batches))

    trainer = quiet_trainer(
        max_epochs=2, check_val_every_n_epoch=2, enable_progress_bar=True, callbacks=[bar, Totals()]
    )
    trainer.fit(Regression(), loader(), loader(regression_data(32, seed=1)))
    assert seen == [(0, 8, 0), (1, 8, 4)]  # validation only in the second epoch
    assert (bar.train_progress_bar.n, bar.train_progress_bar.total) == (8, 8)
    assert bar.val_progress_bar.n == 4  # the last validation
    trainer.test(Regression(), loader(regression_data(16)), verbose=False)
    assert bar.test_progress_bar.n == 2
    capfd.readouterr()


class CustomBars(TQDMProgressBar):
    """Lightning's customisation recipe: override init_*_tqdm and change the bar they return."""

    def __init__(self, buffer: io.StringIO) -> None:
        super().__init__()
        self.buffer = buffer

    def init_train_tqdm(self) -> Any:
        from tqdm import tqdm

        return tqdm(file=self.buffer, bar_format="{desc}|{n_fmt}/{total_fmt}", leave=True)

    def init_validation_tqdm(self) -> Any:
        bar = super().init_validation_tqdm()
        bar.disable = True
        return bar


def test_init_tqdm_overrides_are_drawn_as_they_return_the_bars(capfd: pytest.CaptureFixture[str]) -> None:
    buffer = io.StringIO()
    trainer = quiet_trainer(max_epochs=2, enable_progress_bar=True, callbacks=[CustomBars(buffer)])
    trainer.fit(Regression(), loader(), loader())
    drawn = buffer.getvalue()
    assert "Epoch 0: |8/8" in drawn and "Epoch 1: |8/8" in drawn  # the bar format and file given, our total
    err = capfd.readouterr().err
    assert "Validation" not in err  # switched off by its override
    assert "Epoch 0" not in err  # the training bar went where its override sent it


def _rich_trainer(buffer: io.StringIO, **bar: Any) -> dt.Trainer:
    from drivetrain.trainer.callbacks import RichProgressBar

    progress = RichProgressBar(console_kwargs={"force_terminal": True, "file": buffer, "width": 160}, **bar)
    return quiet_trainer(max_epochs=2, enable_progress_bar=True, callbacks=[progress])


def _fit(trainer: dt.Trainer) -> None:
    trainer.fit(Regression(), loader(), loader(regression_data(32, seed=1)))


def test_rich_bar_renders_bars_with_metrics_on_a_terminal_console() -> None:
    pytest.importorskip("rich")
    buffer = io.StringIO()
    _fit(_rich_trainer(buffer, refresh_rate=1))
    text = ANSI.sub("", buffer.getvalue())
    assert "Epoch 0" in text and "Epoch 1" in text and "Validation" in text
    assert "8/8" in text and "4/4" in text and "it/s" in text
    assert re.search(r"train_loss: \d+\.\d{3}", text) and re.search(r"val_loss: \d+\.\d{3}", text)
    # Lightning's refresh_rate counts batches: each of the 8 training batches drew the epoch's bar.
    assert all(f"{n}/8" in text for n in range(1, 9))


def test_rich_bar_is_off_on_other_ranks_and_with_refresh_rate_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rich")
    buffer = io.StringIO()
    _fit(_rich_trainer(buffer, refresh_rate=0))
    assert buffer.getvalue() == ""
    trainer = _rich_trainer(buffer)
    monkeypatch.setattr(type(trainer.strategy), "is_global_zero", property(lambda self: False))
    _fit(trainer)
    assert buffer.getvalue() == ""
    assert not trainer.progress_bar_callback.is_enabled


def test_rich_summary_is_the_default_next_to_a_rich_bar_and_draws_a_table() -> None:
    pytest.importorskip("rich")
    from rich.console import Console

    from drivetrain.trainer.callbacks import RichModelSummary, RichProgressBar

    trainer = dt.Trainer(accelerator="cpu", logger=False, callbacks=[RichProgressBar()])
    assert [type(cb) for cb in trainer.callbacks if isinstance(cb, ModelSummary)] == [RichModelSummary]
    plain = dt.Trainer(accelerator="cpu", logger=False)
    assert [type(cb) for cb in plain.callbacks if isinstance(cb, ModelSummary)] == [ModelSummary]

    buffer = io.StringIO()
    summary = RichModelSummary(max_depth=2, header_style="bold")
    summary.console = Console(file=buffer, width=120)
    quiet_trainer(max_steps=1, enable_model_summary=True, callbacks=[summary]).fit(Regression(), loader())
    text = buffer.getvalue()
    assert "net.0" in text and "Linear" in text and "Params" in text
    assert re.search(r"49\s+Trainable params", text) and re.search(r"49\s+Total params", text)
    with pytest.raises(ValueError, match="the table takes header_style"):
        RichModelSummary(colour="red")


def test_rich_classes_name_the_extra_when_rich_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from drivetrain.trainer.callbacks import RichModelSummary, RichProgressBar

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a)
    )
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'drivetrain\[rich\]'"):
        RichProgressBar()
    with pytest.raises(ModuleNotFoundError, match=r"RichModelSummary draws with the rich library"):
        RichModelSummary()


# -- a real terminal ------------------------------------------------------------------------------


def _in_tmux(kind: str) -> str:
    """Run the program in a detached tmux pane (a real terminal, 150 columns) and return the screen."""
    server = f"drivetrain-test-{uuid.uuid4().hex[:8]}"
    marker = "PROGRAM-EXITED"
    env = " ".join(f"{k}='{v}'" for k, v in clean_env().items() if k in ("PYTHONPATH", "PATH", "HOME"))
    command = (
        f"env {env} TERM=xterm-256color {sys.executable} {PROGRAM} {kind} 1; echo {marker} $?; sleep 600"
    )
    tmux = ["tmux", "-L", server]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "t", "-x", "150", "-y", "50", command], check=True, timeout=30
    )
    try:
        deadline = time.monotonic() + 240
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", "t"], capture_output=True, text=True, timeout=30
            ).stdout
            if marker in screen:
                break
            time.sleep(0.5)  # polling the pane: the program runs in another process tree
        else:
            raise AssertionError(f"the {kind} program did not finish in tmux; screen:\n{screen}")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
    assert f"{marker} 0" in screen, screen
    return screen


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (scripts/install-test-deps installs it)")
@pytest.mark.parametrize("kind", ["tqdm", "rich"])
def test_bars_in_a_real_terminal_one_per_stage(kind: str) -> None:
    if kind == "rich":
        pytest.importorskip("rich")
    lines = _in_tmux(kind).splitlines()
    epochs = [line for line in lines if line.startswith("Epoch ")]
    if kind == "rich":
        (last,) = epochs  # leave=False: one epoch bar, the last one's
        assert last.startswith("Epoch 1") and "8/8" in last
        assert "train_loss:" in last and "val_loss:" in last and "it/s" in last
        assert not [line for line in lines if "Validation" in line or "Sanity" in line]  # gone when done
    else:
        assert [line.split(":")[0] for line in epochs] == ["Epoch 0", "Epoch 1"]  # leave=True keeps both
        assert all("8/8" in line and "it/s" in line and "train_loss=" in line for line in epochs)
        assert "val_loss=" in epochs[1]
    assert len([line for line in lines if line.startswith("Testing")]) == (1 if kind == "rich" else 0)
    assert sum("message from training_step" in line for line in lines) == 1  # above the bars, whole
    assert sum(line.strip() == "program finished" for line in lines) == 1


class OutStream(io.StringIO):
    """Stands in for a notebook's stderr (ipykernel's OutStream): not a terminal, but it renders redraws."""


OutStream.__module__ = "ipykernel.iostream"


def test_a_notebook_gets_bars_not_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = OutStream()
    monkeypatch.setattr(sys, "stderr", notebook)
    quiet_trainer(max_epochs=1, enable_progress_bar=True, callbacks=[TQDMProgressBar(refresh_rate=4)]).fit(
        Regression(), loader()
    )
    text = notebook.getvalue()
    assert "\r" in text and "4/8" in text and "8/8" in text  # tqdm's redraws, as in a terminal
