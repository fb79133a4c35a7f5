"""A loaded checkpoint never makes ModelCheckpoint delete anything but its own checkpoints.

A checkpoint file is data from anywhere. Its ``callbacks`` entry lists paths (the ranking, the
files still to prune, ``last``); each test writes a real checkpoint through a fit, rewrites that
entry to name files and folders the callback must not touch (outside its folder, through ``..``,
absolute, another folder's ``last.ckpt``, a file of another name in its own folder), resumes a fit
that saves and prunes several times, and asserts every one of them is still there. The pruning
that is the callback's job (its own displaced checkpoints) still happens.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from drivetrain.trainer import Callback, ModelCheckpoint
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


class Scored(Regression):
    """Logs a score that improves with every step, so every save is a new best."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("score", float(self.global_step))
        return super().training_step(batch, batch_idx)


def _callback(dirpath: str | Path, **kwargs: Any) -> ModelCheckpoint:
    settings: dict[str, Any] = {
        "dirpath": dirpath,
        "monitor": "score",
        "mode": "max",
        "save_top_k": 1,
        "every_n_train_steps": 2,
        "filename": "{step}",
        "save_last": True,
    }
    settings.update(kwargs)
    return ModelCheckpoint(**settings)


def _fit(callback: ModelCheckpoint, max_steps: int, ckpt_path: str | Path | None = None) -> Any:
    torch.manual_seed(0)
    trainer = quiet_trainer(max_steps=max_steps, enable_checkpointing=True, callbacks=[callback])
    trainer.fit(Scored(), loader(regression_data(64)), ckpt_path=ckpt_path)
    return trainer


def _plant(path: Path, callback: ModelCheckpoint, **entries: Any) -> None:
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["callbacks"][callback.state_key].update(entries)
    torch.save(checkpoint, path)


def _victims(root: Path) -> list[Path]:
    (root / "victim_dir").mkdir()
    (root / "victim_dir" / "data.txt").write_text("precious")
    (root / "victim.ckpt").write_text("precious")
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "last.ckpt").write_text("another run's last checkpoint")
    return [root / "victim_dir" / "data.txt", root / "victim.ckpt", root / "elsewhere" / "last.ckpt"]


_OUTSIDE = [
    "checkpoints/../../../victim_dir",
    "{folder}/../../../victim.ckpt",
    "{root}/victim_dir",
    "{root}/elsewhere/last.ckpt",
    "../../victim.ckpt",
]


@pytest.mark.parametrize("entry", ["pending_removals", "best_k_models", "recent", "last_model_path"])
@pytest.mark.parametrize("relative", [True, False], ids=["dirpath='checkpoints'", "absolute dirpath"])
def test_a_planted_checkpoint_cannot_make_pruning_delete_outside_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool, entry: str
) -> None:
    workdir = tmp_path / "project" / "run"
    workdir.mkdir(parents=True)
    monkeypatch.chdir(workdir)
    folder = "checkpoints" if relative else str(workdir / "checkpoints")
    # recent is the ranking without a monitor (the k most recent).
    settings: dict[str, Any] = {"monitor": None, "filename": None} if entry == "recent" else {}
    _fit(_callback(folder, **settings), max_steps=2)
    victims = _victims(tmp_path)
    outside = [path.format(folder=folder, root=tmp_path) for path in _OUTSIDE]
    planted: dict[str, Any] = {
        "pending_removals": {"pending_removals": outside},
        # A score worse than any real one: the next save displaces it from the top k.
        "best_k_models": {
            "best_k_models": {path: torch.tensor(-1.0e9, dtype=torch.float64) for path in outside}
        },
        "recent": {"recent": outside[:1]},
        "last_model_path": {"last_model_path": str(tmp_path / "elsewhere" / "last.ckpt")},
    }[entry]
    if entry == "best_k_models":
        planted["kth_best_model_path"] = outside[0]
    _plant(workdir / "checkpoints" / "last.ckpt", _callback(folder, **settings), **planted)
    _fit(_callback(folder, **settings), max_steps=8, ckpt_path="checkpoints/last.ckpt")
    for victim in victims:
        assert victim.exists(), f"{victim} was deleted on the say-so of a loaded checkpoint"
    assert (tmp_path / "victim_dir").is_dir()
    assert "last.ckpt" in os.listdir(workdir / "checkpoints")  # the fit itself went on saving


def test_a_planted_checkpoint_cannot_name_other_files_in_the_callbacks_folder(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    _fit(_callback(folder), max_steps=2)
    keep = [folder / "notes.txt", folder / "exported.ckpt", folder / "model.pt"]
    for path in keep:
        path.write_text("the user's own file")
    (folder / "subfolder").mkdir()
    keep.append(folder / "subfolder")
    names = [str(path) for path in keep]
    planted = _callback(folder)
    _plant(
        folder / "step=2.ckpt",
        planted,
        pending_removals=names,
        best_k_models={path: torch.tensor(-1.0e9, dtype=torch.float64) for path in names},
        recent=names,
        last_model_path=str(folder / "exported.ckpt"),
    )
    _fit(_callback(folder), max_steps=6, ckpt_path=folder / "step=2.ckpt")
    for path in keep:
        assert path.exists(), f"{path} is not a checkpoint this callback writes, yet it was deleted"


def test_a_pending_removal_that_names_a_kept_checkpoint_leaves_it_in_place(tmp_path: Path) -> None:
    """A name both in the files to prune and in the ranking (or ``last``) is kept: pruning never deletes
    a checkpoint the callback still names as its best or its last, whatever the loaded state says."""
    folder = tmp_path / "checkpoints"
    # mode="min" on a score that grows with every step: step=2.ckpt stays the best throughout.
    _fit(_callback(folder, mode="min"), max_steps=2)
    best, last = str(folder / "step=2.ckpt"), str(folder / "last.ckpt")
    _plant(folder / "last.ckpt", _callback(folder, mode="min"), pending_removals=[best, last])
    callback = _callback(folder, mode="min")
    _fit(callback, max_steps=6, ckpt_path="last")
    assert callback.best_model_path == best and callback.last_model_path == last
    assert sorted(os.listdir(folder)) == ["last.ckpt", "step=2.ckpt"]
    assert torch.load(last, weights_only=True)["global_step"] == 6  # rewritten, then kept


def test_a_link_in_the_folder_is_removed_as_a_link_never_followed(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    _fit(_callback(folder, save_last=False), max_steps=2)
    target = tmp_path / "victim_dir"
    target.mkdir()
    (target / "data.txt").write_text("precious")
    (folder / "step=1.ckpt").symlink_to(target, target_is_directory=True)
    planted = _callback(folder, save_last=False)
    _plant(folder / "step=2.ckpt", planted, pending_removals=[str(folder / "step=1.ckpt")])
    _fit(_callback(folder, save_last=False), max_steps=6, ckpt_path=folder / "step=2.ckpt")
    assert (target / "data.txt").read_text() == "precious"


def test_the_checkpoint_named_by_ckpt_path_is_not_pruned(tmp_path: Path) -> None:
    """As in Lightning: a fit resumed from an explicit path keeps that file even when it leaves the top k."""
    folder = tmp_path / "checkpoints"
    _fit(_callback(folder, save_last=False), max_steps=4)
    assert sorted(os.listdir(folder)) == ["step=4.ckpt"]
    _fit(_callback(folder, save_last=False), max_steps=8, ckpt_path=folder / "step=4.ckpt")
    assert sorted(os.listdir(folder)) == ["step=4.ckpt", "step=8.ckpt"]


def test_pruning_still_finishes_what_a_crash_left_in_the_own_folder(tmp_path: Path) -> None:
    """A crash between publishing a checkpoint and pruning: the resumed fit removes the displaced file."""
    folder = tmp_path / "checkpoints"
    _fit(_callback(folder, save_last=False), max_steps=4)
    # The state step=4.ckpt recorded still lists step=2.ckpt as to be pruned; put the file back.
    state = torch.load(folder / "step=4.ckpt", weights_only=True)["callbacks"]
    assert any(str(folder / "step=2.ckpt") in s.get("pending_removals", []) for s in state.values())
    shutil.copy(folder / "step=4.ckpt", folder / "step=2.ckpt")
    os.utime(folder / "step=2.ckpt", (1, 1))
    _fit(_callback(folder, save_last=False), max_steps=6, ckpt_path="last")
    assert sorted(os.listdir(folder)) == ["step=6.ckpt"]


@pytest.mark.parametrize("seconds_apart", [10, 0], ids=["later", "same-second"])
def test_a_crash_between_the_top_k_file_and_last_resumes_from_the_newer_step(
    tmp_path: Path, seconds_apart: int
) -> None:
    """save_last: a save writes ``step=N.ckpt`` then ``last.ckpt``; killed in between, ``last`` is one save old.

    Resuming with ``ckpt_path="last"`` must continue from step N (the newest complete checkpoint),
    and nothing of the interrupted save may be left behind once the resumed fit saves again. Also
    when both files carry the same time (object stores such as S3 keep whole seconds).
    """
    folder = tmp_path / "checkpoints"
    _fit(_callback(folder), max_steps=2)
    old_last = tmp_path / "last-at-step-2.ckpt"
    old_top = tmp_path / "step=2.ckpt"
    shutil.copy(folder / "last.ckpt", old_last)
    shutil.copy(folder / "step=2.ckpt", old_top)
    _fit(_callback(folder), max_steps=4, ckpt_path="last")
    # Rebuild the folder as the kill left it: step=2 (not yet pruned), step=4, and last from step 2.
    shutil.copy(old_top, folder / "step=2.ckpt")
    shutil.copy(old_last, folder / "last.ckpt")
    now = (folder / "step=4.ckpt").stat().st_mtime
    os.utime(folder / "step=2.ckpt", (now - 20, now - 20))
    os.utime(folder / "last.ckpt", (now - seconds_apart, now - seconds_apart))
    steps: list[int] = []

    class FirstStep(Callback):
        def on_train_start(self, trainer: Any, module: Any) -> None:
            steps.append(trainer.global_step)

    torch.manual_seed(0)
    trainer = quiet_trainer(
        max_steps=8, enable_checkpointing=True, callbacks=[FirstStep(), _callback(folder)]
    )
    trainer.fit(Scored(), loader(regression_data(64)), ckpt_path="last")
    assert steps == [4]
    assert sorted(os.listdir(folder)) == ["last.ckpt", "step=8.ckpt"]


RESUME_SCRIPT = Path(__file__).parents[1] / "trainer" / "scripts" / "resume_pruning.py"


@pytest.mark.timeout(300)
def test_the_files_a_resumed_fit_keeps_are_lightnings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The same program on Lightning 2.6 and here leaves the same files: the explicitly resumed-from checkpoint
    stays when it leaves the top k, ``ckpt_path="last"`` rotates as usual, and another folder's files all stay."""
    import importlib.util
    import json

    from helpers.peers import lightning_results_file

    theirs = json.loads(
        lightning_results_file(RESUME_SCRIPT, "resume-pruning", request, tmp_path_factory).read_text()
    )
    spec = importlib.util.spec_from_file_location("resume_pruning", RESUME_SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ours = script.run_all("drivetrain")
    assert ours == theirs
    assert "step=6.ckpt" in ours["top_k"][1] and "step=6.ckpt" in ours["other_folder"][1]
