"""A failed or interrupted save never costs the previous checkpoint; resume picks the newest complete one.

Failures here are raised by a CheckpointIO in the middle of a save (a full disk, say); the kill -9
variants of the same scenarios are in ``test_kill_during_save.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.plugins.io import TorchCheckpointIO
from drivetrain.trainer import Callback, ModelCheckpoint
from drivetrain.utils import ProjectConfiguration
from helpers.scripts import clean_env, run_command
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data


class DiskFullOnSave(TorchCheckpointIO):
    """Fails the ``fail_at``-th save after writing part of the file, as a full disk would."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.saves = 0

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        self.saves += 1
        if self.saves == self.fail_at:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            raise OSError(28, "No space left on device")
        super().save_checkpoint(checkpoint, path, storage_options)


class Scored(Regression):
    """Logs a score that improves with every step, so every save is a new best."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("score", float(self.global_step))
        return super().training_step(batch, batch_idx)


class RecordWeights(Callback):
    def __init__(self) -> None:
        self.at_step: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_end(self, trainer: dt.Trainer, module: Any, *args: Any) -> None:
        self.at_step[trainer.global_step] = {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_top_1_keeps_the_old_best_when_writing_the_new_one_fails(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, monitor="score", mode="max", save_top_k=1, every_n_train_steps=2, filename="{step}"
    )
    recorder = RecordWeights()
    trainer = quiet_trainer(
        max_steps=6, enable_checkpointing=True, callbacks=[recorder, checkpoint], plugins=[DiskFullOnSave(2)]
    )
    torch.manual_seed(0)
    with pytest.raises(OSError, match="No space left"):
        trainer.fit(Scored(), loader(regression_data(64)))
    assert checkpoint.best_model_path == str(tmp_path / "step=2.ckpt")
    assert os.listdir(tmp_path) == ["step=2.ckpt"]
    saved = torch.load(checkpoint.best_model_path, weights_only=True)["state_dict"]
    for key, value in recorder.at_step[2].items():  # the best path holds the weights it claims
        assert torch.equal(saved[key], value)


def test_the_displaced_best_is_removed_after_the_new_one_is_written(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path, monitor="score", mode="max", save_top_k=2, every_n_train_steps=2, filename="{step}"
    )
    trainer = quiet_trainer(max_steps=8, enable_checkpointing=True, callbacks=[checkpoint])
    trainer.fit(Scored(), loader(regression_data(64)))
    assert sorted(os.listdir(tmp_path)) == ["step=6.ckpt", "step=8.ckpt"]
    assert checkpoint.best_model_path == str(tmp_path / "step=8.ckpt")
    # The newest checkpoint records the ranking it belongs to, with nothing left to prune.
    state = torch.load(tmp_path / "step=8.ckpt", weights_only=True)["callbacks"][checkpoint.state_key]
    assert sorted(state["best_k_models"]) == [str(tmp_path / "step=6.ckpt"), str(tmp_path / "step=8.ckpt")]
    assert state["pending_removals"] == [str(tmp_path / "step=4.ckpt")]


def test_resume_from_last_passes_over_a_damaged_checkpoint(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, save_last=True)
    quiet_trainer(max_steps=4, enable_checkpointing=True, callbacks=[checkpoint]).fit(
        Regression(), loader(regression_data(64))
    )
    last = tmp_path / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])  # truncated behind our back (a copy that did not finish)
    resumed = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, save_last=True)
    trainer = quiet_trainer(max_steps=6, enable_checkpointing=True, callbacks=[resumed])
    with pytest.warns(UserWarning, match=r"Skipping incomplete or damaged checkpoint\(s\) '.*last\.ckpt'"):
        trainer.fit(Regression(), loader(regression_data(64)), ckpt_path="last")
    assert trainer.global_step == 6  # resumed at step 4 (epoch=0-step=4.ckpt), not from scratch


def _accelerator(tmp_path: Path, **kwargs: Any) -> tuple[dt.Accelerator, nn.Module, Any]:
    accelerator = dt.Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=1
        ),
        **kwargs,
    )
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _step(model: nn.Module, optimizer: Any, accelerator: dt.Accelerator) -> None:
    accelerator.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    optimizer.zero_grad()


def test_automatic_checkpoints_are_pruned_only_after_the_new_one_is_complete(tmp_path: Path) -> None:
    accelerator, model, optimizer = _accelerator(tmp_path, plugins=[DiskFullOnSave(2)])
    _step(model, optimizer, accelerator)
    accelerator.save_state()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _step(model, optimizer, accelerator)
    with pytest.raises(OSError, match="No space left"):
        accelerator.save_state()
    root = tmp_path / "checkpoints"
    assert (root / "checkpoint_0" / "state.ckpt").is_file()  # total_limit=1 did not remove it first

    resumed, model, _ = _accelerator(tmp_path)
    with pytest.warns(UserWarning, match=r"Skipping incomplete automatic checkpoint\(s\) 'checkpoint_1'"):
        loaded = resumed.load_state()
    assert loaded == str(root / "checkpoint_0")
    for key, value in saved.items():
        assert torch.equal(model.state_dict()[key], value)
    # Counting goes on from the newest complete checkpoint; the broken one is replaced, the old one pruned.
    resumed.save_state()
    assert sorted(os.listdir(root)) == ["checkpoint_1"]
    assert os.listdir(root / "checkpoint_1") == ["state.ckpt"]


def test_manual_save_state_replaces_a_state_atomically(tmp_path: Path) -> None:
    accelerator, model, optimizer = _accelerator(tmp_path, plugins=[DiskFullOnSave(2)])
    accelerator.save_state(tmp_path / "manual")
    before = (tmp_path / "manual" / "state.ckpt").read_bytes()
    _step(model, optimizer, accelerator)
    with pytest.raises(OSError):
        accelerator.save_state(tmp_path / "manual")
    assert (tmp_path / "manual" / "state.ckpt").read_bytes() == before
    assert os.listdir(tmp_path / "manual") == ["state.ckpt"]


def test_load_state_of_a_folder_a_killed_save_left_loads_the_newest_complete_state_beside_it(
    tmp_path: Path,
) -> None:
    """save_state(dir) creates ``dir`` before its state is complete: a kill leaves a folder a resume picks."""
    accelerator, model, optimizer = _accelerator(tmp_path)
    accelerator.save_state(tmp_path / "runs" / "step_2")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _step(model, optimizer, accelerator)
    accelerator.save_state(tmp_path / "elsewhere" / "step_3")  # another folder: not a candidate
    killed = tmp_path / "runs" / "step_4"  # as a kill in the middle of its write leaves it
    killed.mkdir()
    (killed / ".state.ckpt.drivetrain-partial-0123456789ab").write_bytes(b"PK\x03\x04 half a state")

    resumed, model, _ = _accelerator(tmp_path)
    with pytest.warns(
        UserWarning, match=r"load_state\('.*step_4'\): that folder holds no complete state; a "
    ):
        loaded = resumed.load_state(killed)
    assert loaded == str(tmp_path / "runs" / "step_2")
    for key, value in saved.items():
        assert torch.equal(model.state_dict()[key], value)

    (tmp_path / "alone").mkdir()
    with pytest.raises(
        FileNotFoundError, match=r"a save_state into it was interrupted .* no folder beside it"
    ):
        resumed.load_state(tmp_path / "alone")


def _can_mount_a_small_disk() -> bool:
    try:
        done = subprocess.run(
            ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.skipif(not _can_mount_a_small_disk(), reason="needs unshare with user and mount namespaces")
def test_a_full_disk_is_named_with_the_space_needed_and_the_previous_checkpoint_stays(tmp_path: Path) -> None:
    """A real full disk (a 1 MB tmpfs, mounted in a private namespace): torch only says ``unexpected pos``."""
    folder = tmp_path / "disk"
    folder.mkdir()
    script = Path(__file__).parent / "scripts" / "full_disk_fit.py"
    command = f"mount -t tmpfs -o size=1m tmpfs '{folder}' && exec '{sys.executable}' '{script}' '{folder}'"
    done = run_command(["unshare", "-Urm", "sh", "-c", command], timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"OSError: \[Errno 28\] No space left on device writing the checkpoint '.*step=4\.ckpt': it needs "
        r"\d+\.\d kB and '.*disk' has \d+\.\d kB free\. The previous checkpoint under that name",
        done.stdout,
    ), done.stdout + done.stderr
    assert "kept ['epoch=0-step=2.ckpt'] at step 2" in done.stdout, done.stdout


# -- two runs saving automatic checkpoints into one project folder ----------------------------------
@contextmanager
def _paused_save(project: Path, gates: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process's save_state() into ``project``, held in the middle of writing ``checkpoint_0``."""
    gates.mkdir()
    script = Path(__file__).parent / "scripts" / "paused_save_state.py"
    other = subprocess.Popen(
        [sys.executable, str(script), str(project), str(gates)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(OMP_NUM_THREADS="1"),
    )
    try:
        deadline = time.monotonic() + 90
        while not (gates / "writing").exists():
            assert other.poll() is None and time.monotonic() < deadline, other.communicate()
            time.sleep(0.02)
        yield other
    finally:
        (gates / "go").write_text("")
        try:
            other.communicate(timeout=60)
        finally:
            other.kill()


def test_pruning_leaves_alone_a_checkpoint_another_run_is_writing(tmp_path: Path) -> None:
    project = tmp_path / "project"
    with _paused_save(project, tmp_path / "gates") as other:
        config = ProjectConfiguration(
            project_dir=str(project), automatic_checkpoint_naming=True, total_limit=1, iteration=5
        )
        accelerator = dt.Accelerator(cpu=True, project_config=config)
        model = accelerator.prepare(nn.Linear(4, 1))
        accelerator.save_state()  # total_limit=1: prunes what it finds complete or abandoned
        (tmp_path / "gates" / "go").write_text("")
        out, err = other.communicate(timeout=60)
    assert out.strip() == f"saved {project / 'checkpoints' / 'checkpoint_0'}", out + err
    # (Its own total_limit=1 then removed checkpoint_5, as Accelerate's does: one folder, one limit.)
    assert os.listdir(project / "checkpoints" / "checkpoint_0") == ["state.ckpt"]
    assert model is not None


def test_a_save_whose_folder_is_removed_meanwhile_says_so(tmp_path: Path) -> None:
    project = tmp_path / "project"
    with _paused_save(project, tmp_path / "gates") as other:
        shutil.rmtree(project / "checkpoints" / "checkpoint_0")  # as another run's pruning, or a clean-up
        (tmp_path / "gates" / "go").write_text("")
        out, err = other.communicate(timeout=60)
    assert re.fullmatch(
        r"FileNotFoundError: save_state: the folder '.*checkpoint_0' was removed while this process was writing "
        r"its state into it, so nothing was saved\. Another process .* Give each run its own project_dir .*",
        out.strip(),
    ), out + err


# -- folders written by every rank ----------------------------------------------------------------
def _folders_rank(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    from drivetrain.strategies.checkpoint_folders import CheckpointWriteError, staged_folder

    strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=world_size)
    strategy.setup_environment()
    target = Path(folder) / "sharded.ckpt"
    outcomes: dict[str, Any] = {}

    def write(version: int, fail_on: int | None = None, verify: Any = None) -> None:
        with staged_folder(strategy, target, verify=verify) as staging:
            (staging / f"part-{rank}").write_text(str(version))
            if rank == fail_on:
                raise RuntimeError(f"rank {rank} could not write")

    write(1)
    write(2)  # replaces version 1 whole
    outcomes["after_replace"] = sorted(os.listdir(folder)), (target / f"part-{rank}").read_text()
    for name, kwargs in {
        "rank_1_fails": {"fail_on": 1},
        "verify_fails": {"verify": lambda staging: (_ for _ in ()).throw(ValueError("incomplete"))},
    }.items():
        try:
            write(3, **kwargs)
        except (RuntimeError, ValueError, CheckpointWriteError) as error:
            outcomes[name] = f"{type(error).__name__}: {error}"
        strategy.barrier()
        outcomes[name + "_left"] = sorted(os.listdir(folder)), (target / f"part-{rank}").read_text()
    return outcomes


@pytest.mark.multiprocess
def test_a_folder_from_every_rank_is_published_whole_or_not_at_all(tmp_path: Path) -> None:
    from helpers.multiprocess import run_processes

    results = run_processes(_folders_rank, 2, args=(str(tmp_path),), timeout=60)
    for rank, outcome in enumerate(results):
        assert outcome["after_replace"] == (["sharded.ckpt"], "2")
        # Any rank's failure fails the save on every rank, and version 2 stays, with nothing left over.
        assert outcome["rank_1_fails_left"] == (["sharded.ckpt"], "2")
        assert outcome["verify_fails_left"] == (["sharded.ckpt"], "2")
        expected = "RuntimeError: rank 1 could not write" if rank == 1 else "CheckpointWriteError"
        assert outcome["rank_1_fails"].startswith(expected)
        assert "incomplete" in outcome["verify_fails"]
    assert "failed on rank 1" in results[0]["rank_1_fails"]
