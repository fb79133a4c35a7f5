"""Both front doors against a real S3 API: moto in server mode on 127.0.0.1, reached through s3fs.

The programs reach the server as users reach S3: an ``s3://`` path and AWS's standard
environment variables (``AWS_ENDPOINT_URL`` and credentials); ranks are real gloo processes.
"""

from __future__ import annotations

import os
import posixpath
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import drivetrain as dt
from drivetrain.plugins.io import TorchCheckpointIO
from drivetrain.trainer import Callback, ModelCheckpoint
from drivetrain.utils import ProjectConfiguration
from helpers.multiprocess import run_processes
from helpers.scripts import clean_env, run_script
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data, weights

pytestmark = pytest.mark.multiprocess

SCRIPTS = Path(__file__).parent / "scripts"


def listing(url: str) -> list[str]:
    """Every object under ``url``, relative to it (a fresh client: nothing cached)."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    inner = url.split("://", 1)[1]
    return sorted(posixpath.relpath(path, inner) for path in fs.find(inner))


# -- the Trainer: checkpoints and CSV logs in s3://bucket/run, resume from "last" --------------------
def _trainer_program(rank: int, world_size: int, root: str, strategy: str) -> dict[str, Any]:
    def fit(
        folder: str, epochs: int, ckpt_path: str | None = None
    ) -> tuple[dt.Trainer, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        model = Regression()
        trainer = quiet_trainer(
            strategy=strategy,
            devices=world_size,
            default_root_dir=folder,
            max_epochs=epochs,
            logger="csv",
            log_every_n_steps=1,
            enable_checkpointing=True,
            callbacks=[ModelCheckpoint(dirpath=f"{folder}/checkpoints", save_last=True)],
        )
        trainer.fit(model, loader(regression_data(32), batch_size=4, shuffle=True), ckpt_path=ckpt_path)
        full = trainer.strategy.get_module_state_dict(trainer.model) if strategy == "fsdp" else weights(model)
        return trainer, {k: v.detach().clone() for k, v in full.items()}

    first, _ = fit(f"{root}/run", 2)
    resumed, resumed_weights = fit(f"{root}/run", 4, ckpt_path="last")
    _, straight = fit(f"{root}/straight", 4)
    callback = first.checkpoint_callback
    assert callback is not None
    return {
        "steps": (first.global_step, resumed.global_step),
        "best": callback.best_model_path,
        "log_dir": first.log_dir,
        "same": all(torch.equal(resumed_weights[k], straight[k]) for k in straight),
        "weights": resumed_weights,
    }


@pytest.mark.parametrize(("processes", "strategy"), [(1, "auto"), (2, "ddp"), (2, "fsdp")])
def test_a_trainer_fit_writes_checkpoints_and_logs_to_s3_and_resumes_from_last(
    s3_bucket: str, tmp_path: Path, processes: int, strategy: str
) -> None:
    root = f"{s3_bucket}/run-{strategy}"
    if processes == 1:
        results = [_trainer_program(0, 1, root, strategy)]
    else:
        results = run_processes(_trainer_program, processes, args=(root, strategy), timeout=180)
    main = results[0]
    steps_per_epoch = 8 // processes
    assert main["steps"] == (2 * steps_per_epoch, 4 * steps_per_epoch)
    assert all(result["same"] for result in results)  # resumed from s3 = one uninterrupted run
    assert main["best"] == f"{root}/run/checkpoints/epoch=1-step={2 * steps_per_epoch}.ckpt"
    assert main["log_dir"] == f"{root}/run/drivetrain_logs/version_0"
    objects = listing(f"{root}/run")
    assert (
        "drivetrain_logs/version_0/metrics.csv" in objects
        and "drivetrain_logs/version_1/metrics.csv" in objects
    )
    assert not [name for name in objects if "drivetrain-partial" in name]
    if strategy != "fsdp":
        assert [o for o in objects if o.startswith("checkpoints/")] == [
            f"checkpoints/epoch=3-step={4 * steps_per_epoch}.ckpt",
            "checkpoints/last.ckpt",
        ]
        return
    # Sharded: each checkpoint is a folder every rank wrote, completed by its marker.
    last = sorted(o for o in objects if o.startswith("checkpoints/last.ckpt/"))
    assert last == [
        "checkpoints/last.ckpt/.drivetrain-complete",
        "checkpoints/last.ckpt/.metadata",
        "checkpoints/last.ckpt/__0_0.distcp",
        "checkpoints/last.ckpt/__1_0.distcp",
        "checkpoints/last.ckpt/drivetrain_state.pt",
    ]
    # drivetrain consolidate reads the sharded folder from S3 and writes one file there.
    consolidated = f"{root}/consolidated.pt"
    done = run_script(
        ["-m", "drivetrain", "consolidate", f"{root}/run/checkpoints/last.ckpt", consolidated],
        env=clean_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    state = TorchCheckpointIO().load_checkpoint(consolidated)["state_dict"]
    for name, value in main["weights"].items():
        assert torch.equal(state[name], value), name


# -- the Accelerator: save_state / load_state in s3://bucket/project ----------------------------------
def _accelerator_program(rank: int, world_size: int, root: str) -> dict[str, Any]:
    accelerator = dt.Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=root, automatic_checkpoint_naming=True, total_limit=2
        ),
    )
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    data = DataLoader(regression_data(64), batch_size=4, shuffle=True)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    batches = iter(data)

    def step() -> None:
        x, y = next(batches)
        accelerator.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    saved = []
    for _ in range(3):
        step()
        saved.append(accelerator.save_state())
    for _ in range(2):
        step()
    uninterrupted = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = accelerator.load_state()  # the newest automatic checkpoint, from S3
    batches = iter(data)  # continues after the last batch handed out before the save
    for _ in range(2):
        step()
    return {
        "saved": saved,
        "loaded": loaded,
        "same": all(torch.equal(model.state_dict()[k], v) for k, v in uninterrupted.items()),
    }


@pytest.mark.parametrize("processes", [1, 2])
def test_an_accelerator_saves_and_loads_its_state_in_s3(s3_bucket: str, processes: int) -> None:
    root = f"{s3_bucket}/project"
    if processes == 1:
        results = [_accelerator_program(0, 1, root)]
    else:
        results = run_processes(_accelerator_program, processes, args=(root,), timeout=120)
    assert all(result["same"] for result in results)
    assert results[0]["saved"] == [f"{root}/checkpoints/checkpoint_{i}" for i in range(3)]
    assert results[0]["loaded"] == f"{root}/checkpoints/checkpoint_2"
    # total_limit=2 pruned the oldest once the newest was complete.
    assert listing(root) == ["checkpoints/checkpoint_1/state.ckpt", "checkpoints/checkpoint_2/state.ckpt"]


def test_storage_options_reach_the_filesystem_from_the_checkpoint_io_and_the_trainer(
    s3_bucket: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # only the options say where the server is
    import s3fs

    options = {
        "endpoint_url": s3_endpoint,
        "key": "testing",
        "secret": "testing",
        "skip_instance_cache": True,
    }
    io = TorchCheckpointIO()
    io.save_checkpoint({"a": torch.ones(2)}, f"{s3_bucket}/opts/x.ckpt", storage_options=options)

    class SaveWithOptions(Callback):
        def on_train_end(self, trainer: dt.Trainer, module: Any) -> None:
            trainer.save_checkpoint(f"{s3_bucket}/opts/trainer.ckpt", storage_options=options)

    trainer = quiet_trainer(max_steps=2, callbacks=[SaveWithOptions()])
    trainer.fit(Regression(), loader(regression_data(16)))
    fs = s3fs.S3FileSystem(**options)
    assert fs.isfile(f"{s3_bucket[5:]}/opts/x.ckpt")
    assert fs.isfile(f"{s3_bucket[5:]}/opts/trainer.ckpt")


def test_a_checkpoint_read_without_credentials_says_so_not_that_it_is_missing(
    s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    path = f"{s3_bucket}/nocreds/model.ckpt"
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(Regression(), loader(regression_data(8)))
    trainer.save_checkpoint(path)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()  # a new process would start without the cached session
    with pytest.raises(
        PermissionError, match=r"Cannot reach 's3://.*/model\.ckpt': no credentials were found"
    ):
        quiet_trainer().validate(Regression(), loader(regression_data(8)), ckpt_path=path)
    s3fs.S3FileSystem.clear_instance_cache()


# -- kill -9 in the middle of a remote checkpoint write -----------------------------------------------
@pytest.mark.parametrize(
    ("point", "write", "top_k", "resumed_from", "kept"),
    [
        # step=4.ckpt dies half uploaded: last.ckpt (step 2) is the newest complete one
        ("upload", 3, -1, 2, ["last.ckpt", "step=2.ckpt", "step=4.ckpt", "step=6.ckpt"]),
        # last.ckpt (step 4) dies before its move, after step=4.ckpt was published: the two files
        # of one second (S3 keeps whole seconds) are told apart by the step they hold
        ("publish", 4, -1, 4, ["last.ckpt", "step=2.ckpt", "step=4.ckpt", "step=6.ckpt"]),
        # the same with save_top_k=1: the resumed run prunes what the killed save left
        ("publish", 4, 1, 4, ["last.ckpt", "step=6.ckpt"]),
    ],
    ids=["upload", "publish", "publish-top-1"],
)
def test_a_kill_during_a_remote_checkpoint_write_leaves_the_newest_complete_checkpoint_to_resume_from(
    s3_bucket: str, point: str, write: int, top_k: int, resumed_from: int, kept: list[str]
) -> None:
    dirpath = f"{s3_bucket}/killed/{point}"
    killed = run_script(
        [str(SCRIPTS / "killed_s3_save.py"), dirpath, point, str(write), str(top_k)],
        env=clean_env(),
        timeout=150,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    before = listing(dirpath)
    assert "last.ckpt" in before
    assert ("step=4.ckpt" in before) == (point == "publish")  # the killed write never appears under its name

    class Resumed(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("ballast", torch.zeros(2_000_000))

        def on_train_start(self) -> None:
            self.started_at = self.trainer.global_step

    model = Resumed()
    checkpoint = ModelCheckpoint(
        dirpath=dirpath, filename="{step}", save_top_k=top_k, every_n_train_steps=2, save_last=True
    )
    trainer = quiet_trainer(max_steps=6, enable_checkpointing=True, callbacks=[checkpoint])
    trainer.fit(model, loader(regression_data(32)), ckpt_path="last")
    assert model.started_at == resumed_from
    assert trainer.global_step == 6
    # No checkpoint is stale. The killed write's temporary object stays until it is an hour old: object
    # stores have no locks, and a younger one may be another process's write in progress. A tidy then
    # removes it (an hour on, as the tidy sees the clock).
    from drivetrain.plugins.io import atomic

    assert [name for name in listing(dirpath) if not atomic.is_temporary(name)] == kept
    later = time.time() + 2 * atomic.REMOTE_LEFTOVER_AGE
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(atomic, "_now", lambda: later)
        atomic.tidy(dirpath)
    assert listing(dirpath) == kept


# -- preemption with the run's folder in S3 ---------------------------------------------------------------
class _SignalledAt(Regression):
    """Sends this process SIGTERM in the training step at ``step`` (once), as a cluster preempting the job."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.signal_step = step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.signal_step:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


class _FirstStep(Callback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_start(self, trainer: dt.Trainer, module: Any) -> None:
        self.steps.append(trainer.global_step)


def test_a_preempted_fit_in_s3_saves_there_and_the_next_fit_resumes_from_it(
    s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preemption checkpoint goes to ``default_root_dir`` in S3, and the next start finds it there
    (listing the bucket, not a local folder named ``s3:``); with ``ckpt_path="hpc"`` too."""
    from drivetrain.strategies.preemption import Preempted

    monkeypatch.chdir(tmp_path)
    root = f"{s3_bucket}/run"
    data = loader(regression_data(64))
    torch.manual_seed(0)
    with pytest.raises(Preempted) as stopped:
        quiet_trainer(max_steps=8, default_root_dir=root).fit(_SignalledAt(3), data)
    assert stopped.value.code == 143
    assert "hpc_ckpt_1.ckpt" in listing(root)
    assert not Path("s3:").exists()
    for request in (None, "hpc"):
        first = _FirstStep()
        trainer = quiet_trainer(max_steps=8, default_root_dir=root, callbacks=[first])
        trainer.fit(Regression(), data, ckpt_path=request)
        assert first.steps == [4], f"ckpt_path={request!r} did not resume from the preemption checkpoint"
        assert trainer.global_step == 8


def test_drivetrain_plot_of_a_run_on_s3_says_where_the_png_went(
    s3_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    import s3fs

    from drivetrain.cli.main import main

    run = f"{s3_bucket}/logs/version_0"
    with s3fs.S3FileSystem(skip_instance_cache=True).open(f"{run}/metrics.csv", "w") as file:
        file.write("step,epoch,train_loss\n0,0,1.0\n1,0,0.5\n")
    assert main(["plot", run]) == 0
    out = capsys.readouterr().out
    assert f"wrote {run}/metrics.png" in out and "metrics.png" in listing(run)
    assert (
        f"the PNG is in remote storage, next to the run; to write it here instead: drivetrain plot {run} -o"
        in out
    )
    assert main(["plot", run, "-o", str(tmp_path / "here.png")]) == 0
    assert (tmp_path / "here.png").read_bytes().startswith(b"\x89PNG")
    assert "remote storage" not in capsys.readouterr().out


# -- a sharded folder without its completion marker is not a checkpoint ---------------------------------
class _StartStep(Callback):
    def on_train_start(self, trainer: dt.Trainer, module: Any) -> None:
        self.step = trainer.global_step


def _unpublished_program(rank: int, world_size: int, root: str) -> dict[str, Any]:
    import s3fs

    def fit(folder: str, max_steps: int, ckpt_path: str | None = None) -> int:
        torch.manual_seed(0)
        start = _StartStep()
        checkpoint = ModelCheckpoint(
            dirpath=f"{root}/{folder}", every_n_train_steps=2, save_top_k=-1, filename="{step}"
        )
        trainer = quiet_trainer(
            strategy="fsdp",
            devices=world_size,
            max_steps=max_steps,
            enable_checkpointing=True,
            callbacks=[start, checkpoint],
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(Regression(), loader(regression_data(32), batch_size=4), ckpt_path=ckpt_path)
        result.setdefault("warnings", []).extend(str(w.message) for w in caught)
        return start.step

    def unpublish(checkpoint: str) -> None:
        """What a crash between writing a folder's last shard and its marker leaves."""
        torch.distributed.barrier()
        if rank == 0:
            s3fs.S3FileSystem(skip_instance_cache=True).rm(f"{root[5:]}/{checkpoint}/.drivetrain-complete")
        torch.distributed.barrier()

    result: dict[str, Any] = {}
    fit("a", 4)
    result["listed"] = listing(f"{root}/a")
    result["newest"] = fit("a", 4, "last")  # folders step=2.ckpt and step=4.ckpt: the newer one
    unpublish("a/step=4.ckpt")
    try:
        fit("a", 4, f"{root}/a/step=4.ckpt")
        result["explicit"] = "loaded"
    except FileNotFoundError as error:
        result["explicit"] = str(error)
    result["last"] = fit("a", 4, "last")  # step=4.ckpt is not published: step=2.ckpt is the newest
    # The only folder in b is not published: "last" finds no checkpoint, and the fit starts afresh.
    fit("b", 2)
    unpublish("b/step=2.ckpt")
    result["only_unpublished"] = fit("b", 2, "last")
    return result


def test_a_sharded_folder_without_its_completion_marker_is_never_read(s3_bucket: str) -> None:
    root = f"{s3_bucket}/unpublished"
    for rank, result in enumerate(run_processes(_unpublished_program, 2, args=(root,), timeout=180)):
        assert "step=4.ckpt/.drivetrain-complete" in result["listed"]
        assert result["newest"] == 4
        assert result["explicit"].startswith(f"ckpt_path='{root}/a/step=4.ckpt' does not exist"), result[
            "explicit"
        ]
        assert result["last"] == 2
        assert result["only_unpublished"] == 0
        if rank == 0:
            assert any("training starts from scratch" in w for w in result["warnings"]), result["warnings"]


def test_tidying_a_remote_folder_leaves_another_processs_write_in_progress(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Object stores have no locks: a temporary object or folder another process is writing (young) stays,
    one a crash left long ago goes. A tidy of this folder used to delete both, breaking the other write."""
    import s3fs

    from drivetrain.plugins.io import atomic

    root = f"{s3_bucket}/checkpoints"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    inner = root.split("://", 1)[1]
    file_leftover = f"{inner}/.step=4.ckpt.drivetrain-partial-0123456789ab"
    folder_leftover = f"{inner}/.step=6.ckpt.drivetrain-partial-abcdef012345"
    fs.pipe_file(file_leftover, b"half a checkpoint")
    fs.pipe_file(f"{folder_leftover}/__0_0.distcp", b"a rank's shard")
    fs.pipe_file(f"{inner}/step=2.ckpt", b"a published checkpoint")
    atomic.tidy(root)
    assert sorted(listing(root)) == [
        ".step=4.ckpt.drivetrain-partial-0123456789ab",
        ".step=6.ckpt.drivetrain-partial-abcdef012345/__0_0.distcp",
        "step=2.ckpt",
    ]
    later = time.time() + 2 * atomic.REMOTE_LEFTOVER_AGE
    monkeypatch.setattr(atomic, "_now", lambda: later)  # an hour on, for drivetrain's tidy only
    atomic.tidy(root)
    assert listing(root) == ["step=2.ckpt"]
