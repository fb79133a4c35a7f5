"""``trainer.fit_loop`` & co.: Lightning's loop counters, read by a callback written for Lightning, against Lightning.

``scripts/loop_views.py`` runs on the peers' interpreter (Lightning 2.6, an oracle; results cached by the
script's content) and here on drivetrain, in one process and in two (each with the batches one process has):
what the callback read at every hook agrees, apart from the moments inside a batch that the views document
(``drivetrain/trainer/loop_views.py``, docs/migrating-from-lightning.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.multiprocess import run_processes
from helpers.peers import lightning_results_file
from trainer.trainer_models import Regression, loader, quiet_trainer

SCRIPT = Path(__file__).parent / "scripts" / "loop_views.py"
_FIT_VALIDATION = ("on_validation_start", "on_validation_batch_end", "on_validation_end")


def _program() -> Any:
    spec = importlib.util.spec_from_file_location("loop_views_program", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lightning_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(
        lightning_results_file(SCRIPT, "loop-views", request, tmp_path_factory), weights_only=True
    )
    return loaded


def _as_documented(seen: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Lightning's readings, moved to the moments at which drivetrain's views count (the documented difference):
    a training batch counts as ready once its step is done; every batch counts as completed inside its
    ``on_*_batch_end``; ``_batches_that_stepped`` counts an optimizer step as soon as it is taken."""
    converted = []
    fitting = sanity = False
    for hook, reading in seen:
        reading = dict(reading)
        fitting = (fitting or hook == "on_train_start") and hook != "on_train_end"
        sanity = (sanity or hook == "on_sanity_check_start") and hook != "on_sanity_check_end"
        if hook == "on_train_batch_start":
            reading["batch_current"] = _ready_after_step(reading["batch_current"])
            reading["batch_total"] = _ready_after_step(reading["batch_total"])
            reading["batch_idx"] = tuple(index - 1 for index in reading["batch_idx"])
        if hook == "on_train_batch_end":
            reading["batch_current"] = _completed_in_hook(reading["batch_current"])
            reading["batch_total"] = _completed_in_hook(reading["batch_total"])
        if fitting and hook in ("on_train_batch_end", *_FIT_VALIDATION):
            reading["batches_that_stepped"] = reading["optimizer_steps"][0]
        if hook == "on_validation_batch_end" and not (fitting or sanity):
            current, total = reading["validate_batches"]
            reading["validate_batches"] = (current + 1, total + 1)
        if hook == "on_test_batch_end":
            reading["test_batches"] += 1
        if hook == "on_predict_batch_end":
            reading["predict"] = _completed_in_hook(reading["predict"])
        converted.append((hook, reading))
    return converted


def _ready_after_step(counts: tuple[int, ...]) -> tuple[int, ...]:
    ready, started, processed, completed = counts
    assert ready == started + 1, "Lightning counts the batch as ready, not yet as started"
    return (started, started, processed, completed)


def _completed_in_hook(counts: tuple[int, ...]) -> tuple[int, ...]:
    ready, started, processed, completed = counts
    assert completed == processed - 1, "Lightning completes the batch after its on_*_batch_end"
    return (ready, started, processed, processed)


def _compare(ours: dict[str, Any], theirs: dict[str, Any], world_size: int = 1) -> None:
    expected = _as_documented(theirs["seen"])
    assert [hook for hook, _ in ours["seen"]] == [hook for hook, _ in expected]
    for position, ((hook, mine), (_, reference)) in enumerate(zip(ours["seen"], expected)):
        if hook.startswith("on_sanity_check") or (position < 5 and hook in _FIT_VALIDATION):
            # Lightning's max_batches is inf until the training loader is set up, after the sanity check.
            mine, reference = dict(mine), dict(reference)
            assert reference["limits"][-1] == float("inf")
            mine["limits"], reference["limits"] = mine["limits"][:-1], reference["limits"][:-1]
        assert mine == reference, f"reading {position} ({hook})"
    assert ours["after_fit"] == theirs["after_fit"] and ours["at_end"] == theirs["at_end"]
    assert (ours["world_size"], theirs["world_size"]) == (world_size, 1)
    # The callback from the issue: the epochs completed, read in on_train_epoch_end.
    assert ours["completed_at_epoch_end"] == theirs["completed_at_epoch_end"] == [0, 1]


def test_a_lightning_callback_reads_the_same_counts_in_one_process(lightning_run: dict[str, Any]) -> None:
    _compare(_program().run("drivetrain"), lightning_run)


def _two_processes(rank: int, world: int) -> dict[str, Any]:
    ours: dict[str, Any] = _program().run("drivetrain", devices=2)
    return ours


@pytest.mark.multiprocess
def test_a_lightning_callback_reads_the_same_counts_in_each_of_two_processes(
    lightning_run: dict[str, Any],
) -> None:
    for ours in run_processes(_two_processes, 2, timeout=120):
        _compare(ours, lightning_run, world_size=2)


def test_the_loop_views_are_read_only_and_exist_before_a_run() -> None:
    trainer = quiet_trainer(max_epochs=3)
    loop = trainer.fit_loop
    progress = (
        loop.max_epochs,
        loop.epoch_progress.current.completed,
        loop.epoch_loop.batch_progress.total.ready,
    )
    assert progress == (3, 0, 0)
    with pytest.raises(
        AttributeError, match=r"FitLoopView.max_epochs cannot be set: .*\(Trainer\(max_epochs="
    ):
        loop.max_epochs = 4
    with pytest.raises(AttributeError, match=r"Counts.completed cannot be set"):
        loop.epoch_progress.current.completed = 1
    trainer.fit(Regression(), loader())
    assert loop.epoch_progress.current.completed == trainer.current_epoch == 3  # a view: it follows the run
    assert trainer.validate_loop.batch_progress.total.ready == 0 and trainer.test_loop.max_batches == []
