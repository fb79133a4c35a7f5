"""The run state the loops, checkpointing and tuner share: a snapshot puts back everything, even what is added later."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from drivetrain.trainer.callbacks import Callback, LearningRateFinder
from drivetrain.trainer.run_state import RunState
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


def _fingerprint(run: RunState) -> dict[str, Any]:
    """Each field's identity (containers: their items), and one level into the components changed in place."""

    def mark(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return ("items", tuple(id(item) for item in value))
        if isinstance(value, dict):
            return ("items", tuple((key, id(item)) for key, item in value.items()))
        return id(value)

    found: dict[str, Any] = {}
    for field in dataclasses.fields(run):
        value = getattr(run, field.name)
        found[field.name] = mark(value)
        if hasattr(value, "snapshot") and hasattr(value, "__dict__"):
            found[field.name + ".*"] = {name: mark(inner) for name, inner in vars(value).items()}
    return found


def test_restore_puts_back_every_field_whatever_replaced_it() -> None:
    run = quiet_trainer(max_epochs=1).run_state
    before = _fingerprint(run)
    saved = run.snapshot()
    for field in dataclasses.fields(run):
        setattr(run, field.name, object())  # every field, including any added after this test was written
    run.restore(saved)
    assert _fingerprint(run) == before


def test_restore_undoes_changes_made_inside_components() -> None:
    run = quiet_trainer(max_epochs=1).run_state
    before = _fingerprint(run)
    saved = run.snapshot()
    run.metrics.persisted["val_loss"] = 1.0
    run.metrics.loggers.append(object())
    run.data.added_by_a_later_version = True  # type: ignore[attr-defined]
    run.progress.global_step = 99
    run.state.stage = None
    run.callbacks.clear()
    run.restore(saved)
    assert _fingerprint(run) == before
    assert run.progress.global_step == 0 and "val_loss" not in run.metrics.persisted
    assert not hasattr(run.data, "added_by_a_later_version")
    run.progress.global_step = 5
    run.restore(saved)  # a snapshot serves any number of restores (one per batch-size trial)
    assert run.progress.global_step == 0


class _Fingerprints(Callback):
    def __init__(self, into: list[dict[str, Any]]) -> None:
        self.into = into

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.into.append(_fingerprint(trainer.run_state))


def test_a_learning_rate_search_leaves_the_run_state_as_it_found_it(tmp_path: Path) -> None:
    """The finder trains inside the fit (its own settings, callbacks, progress, loaders, logged values) and then
    hands the fit back exactly as it was: compared field by field, one level deep, before and after the search."""
    prints: list[dict[str, Any]] = []
    finder = LearningRateFinder(min_lr=1e-4, max_lr=1e-2, num_training_steps=16)
    trainer = quiet_trainer(
        max_epochs=1,
        default_root_dir=tmp_path,
        callbacks=[_Fingerprints(prints), finder, _Fingerprints(prints)],
    )
    trainer.fit(Regression(), loader(regression_data(32), batch_size=2))
    assert finder.optimal_lr is not None and len(finder.optimal_lr.results["lr"]) == 16
    before, after = prints
    assert after == before
    assert trainer.global_step == 16  # the fit itself then trained its own epoch from the start
