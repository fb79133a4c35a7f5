"""drivetrain's messages go through stdlib logging: rank 0 by default, silenced by levels, never through the bar."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain.logging import get_logger
from helpers.scripts import clean_env

PROGRAM = str(Path(__file__).parent / "logging_program.py")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _run(case: str, root: Path, **env: str) -> str:
    """The program's stdout and stderr in one pipe, as a terminal shows them."""
    completed = subprocess.run(
        [sys.executable, PROGRAM, case, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(**env),
        timeout=240,
        start_new_session=True,
    )
    assert completed.returncode == 0, completed.stdout
    return completed.stdout


def _clean_lines(output: str) -> list[str]:
    """Each output line as it ends up on screen: what follows the last carriage return (bar redraws)."""
    lines = []
    for line in _ANSI.sub("", output).split("\n"):
        segments = [s for s in line.split("\r") if s.strip()]
        lines.append(segments[-1].rstrip() if segments else "")
    return lines


def _messages(output: str) -> list[str]:
    return [line for line in _ANSI.sub("", output).split("\n") if "saved" in line or "improved" in line]


def test_messages_and_self_print_go_above_the_progress_bar(tmp_path: Path) -> None:
    output = _run("bar", tmp_path)
    assert "Epoch 1: 100%" in output  # the bar was drawn
    lines = _clean_lines(output)
    expected = [
        "self.print in epoch 0",
        "val_loss improved from inf to 2.73048.",
        f"Epoch 0, step 16: val_loss=2.73048, saved {tmp_path}/ckpt/epoch=0.ckpt",
        "self.print in epoch 1",
        "val_loss improved from 2.73048 to 1.49081.",
        f"Epoch 1, step 32: val_loss=1.49081, saved {tmp_path}/ckpt/epoch=1.ckpt",
    ]
    # Each message is a whole line: nothing of a bar before it on the same line.
    raw_lines = _ANSI.sub("", output).split("\n")
    for message in expected:
        assert message in lines, message
        (raw,) = [line for line in raw_lines if message in line]
        assert raw.replace("\r", "").strip(" ") == message, repr(raw)


def test_levels_silence_drivetrain_and_a_configured_root_logger_takes_over(tmp_path: Path) -> None:
    quiet = _run("quiet", tmp_path / "quiet")
    assert _messages(quiet) == []
    assert "self.print in epoch 1" in quiet  # print is not logging: it stays

    configured = _run("configured", tmp_path / "configured")
    saved = [line for line in _messages(configured) if "saved" in line]
    assert saved == [
        f"CFG drivetrain.trainer.callbacks.model_checkpoint: Epoch {epoch}, step {16 * (epoch + 1)}: "
        f"val_loss={loss}, saved {tmp_path}/configured/ckpt/epoch={epoch}.ckpt"
        for epoch, loss in ((0, "2.73048"), (1, "1.49081"))
    ]  # once each, in the application's format (drivetrain's own handler stays quiet)


@pytest.mark.multiprocess
def test_two_processes_log_once_unless_every_rank_is_asked_for(tmp_path: Path) -> None:
    output = _run("ddp", tmp_path / "default")
    assert len([m for m in _messages(output) if "saved" in m]) == 2  # two epochs, rank 0 only
    lines = _clean_lines(output)
    assert [line for line in lines if line.startswith(("[rank 0] in turn", "[rank 1] in turn"))] == [
        "[rank 0] in turn from rank 0",
        "[rank 1] in turn from rank 1",
    ]  # in_order: rank 0 first, then rank 1
    assert [line for line in lines if line.startswith("once from")] == ["once from rank 0"]

    everywhere = _run("ddp", tmp_path / "all", DRIVETRAIN_LOG_ALL_RANKS="1")
    # Rank 1 shares the terminal with rank 0's bar, which it cannot know about: its line may land after a
    # bar redraw of rank 0 on the same screen line. What matters is that each rank's message is whole.
    saved = sorted(
        re.findall(
            r"(\[rank \d\] Epoch \d, step \d+): val_loss=[0-9.]+, saved \S+\.ckpt", _ANSI.sub("", everywhere)
        )
    )
    assert saved == [
        "[rank 0] Epoch 0, step 8",
        "[rank 0] Epoch 1, step 16",
        "[rank 1] Epoch 0, step 8",
        "[rank 1] Epoch 1, step 16",
    ]


def test_get_logger_is_rank_aware_and_names_the_callers_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = get_logger("drivetrain.tests.example", log_level="DEBUG")
    assert logging.getLogger("drivetrain.tests.example").level == logging.DEBUG
    with caplog.at_level(logging.DEBUG, logger="drivetrain"):
        logger.debug("on rank 0")
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        logger.info("hidden on rank 1")
        logger.warning("shown on rank 1", main_process_only=False)
        monkeypatch.setenv("DRIVETRAIN_LOG_ALL_RANKS", "1")
        logger.error("every rank asked for")
        logger.warning_once("once")
        logger.warning_once("once")
    assert [r.getMessage() for r in caplog.records] == [
        "on rank 0",
        "[rank 1] shown on rank 1",
        "[rank 1] every rank asked for",
        "[rank 1] once",
    ]
    assert {Path(r.pathname).name for r in caplog.records} == {
        "test_logging.py"
    }  # the caller, not the adapter


def test_drivetrain_logs_at_info_unless_the_user_set_a_level() -> None:
    get_logger("drivetrain.tests.other")
    library = logging.getLogger("drivetrain")
    assert library.getEffectiveLevel() == logging.INFO
    assert any(type(h).__name__ == "ConsoleHandler" for h in library.handlers)


class _CallerLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A user's wrapper, as Accelerate's own logging test has it: ``stacklevel=3`` names its caller's line."""

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:
        kwargs["stacklevel"] = 3
        self.logger.log(level, msg, *args, **kwargs)


def test_a_stacklevel_counts_from_the_loggers_own_method_as_in_accelerate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import inspect

    logger = get_logger("drivetrain.tests.stacklevel")
    wrapped = _CallerLogger(logger, {})

    def from_a_helper() -> None:
        logger.warning("helper", stacklevel=2)  # names the helper itself, as Accelerate's does

    with caplog.at_level(logging.WARNING, logger="drivetrain.tests.stacklevel"):
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        wrapped.warning("through a wrapper")
        from_a_helper()
        logger.warning("direct")
    records = [(r.message, r.funcName, r.lineno) for r in caplog.records]
    assert records[0] == (
        "through a wrapper",
        "test_a_stacklevel_counts_from_the_loggers_own_method_as_in_accelerate",
        line,
    )
    assert records[1][:2] == ("helper", "from_a_helper")
    assert records[2] == (
        "direct",
        "test_a_stacklevel_counts_from_the_loggers_own_method_as_in_accelerate",
        line + 2,
    )
